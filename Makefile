# The two quickstart commands: `make demo` and `make test`. Both set everything up.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH_CPU_VERSION ?= 2.13.0
DEMO_ARGS ?=

.PHONY: demo test test-slow setup system-deps lint typecheck bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	# Keep any torch the user already has (CUDA builds included); otherwise take the CPU wheel.
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "using existing torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	else \
		$(PY) -m pip install --quiet "torch==$(TORCH_CPU_VERSION)"; \
	fi
	# the frameworks extra must never replace torch: hold it at the build installed above
	$(PY) -m pip install --quiet -e ".[dev,frameworks,report]" "torch==$$($(PY) -c 'import torch; print(torch.__version__)')"
	@touch $@

setup: $(VENV)/.installed

# Prometheus, Alertmanager and promtool from Debian's packages, for the integration tests;
# Debian's chromium for the status-page tests (Playwright drives it; it never downloads a browser);
# slurm-wlm and munge for the one-node Slurm cluster tests/slurm.py starts.
system-deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null || ! test -x /usr/bin/chromium \
	    || ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus prometheus-alertmanager \
			chromium slurm-wlm munge; \
	fi

demo: setup
	$(VENV)/bin/sentinel demo $(DEMO_ARGS)

test: setup system-deps
	$(PY) -m mypy
	$(PY) -m pytest -q -m "not slow"

# the slow part (a Slurm time limit, the dashboards in the fleet profile): .ci/run runs it too
test-slow: setup system-deps
	$(PY) -m pytest -q -m slow

typecheck: setup
	$(PY) -m mypy

bench: setup
	# the peers benchmarks/peers.py compares against (lightning, wandb), with torch held
	$(PY) -m pip install --quiet -e ".[bench]" "torch==$$($(PY) -c 'import torch; print(torch.__version__)')"
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/peers.py
	$(PY) benchmarks/detection.py
	$(PY) benchmarks/daemon.py
	$(PY) benchmarks/alert_latency.py

clean:
	rm -rf $(VENV) build *.egg-info
