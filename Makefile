# The two quickstart commands: `make demo` and `make test`. Both set everything up.
# `make help` lists the targets: each one carries a `## ` line, which is its help.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH_CPU_VERSION ?= 2.13.0
# where that torch comes from when none is importable: pip's own indexes by default (here they
# hold the CPU build); on a Linux machine that reaches it, TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
DEMO_ARGS ?=
# the frameworks extra must never replace torch: every install holds it at the build installed
HOLD_TORCH = "torch==$$($(PY) -c 'import torch; print(torch.__version__)')"

.PHONY: help demo test test-slow setup setup-demo system-deps lint typecheck docs bench clean

help: ## list the targets
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/\1\t\2/' \
		| awk -F'\t' '{printf "%-12s %s\n", $$1, $$2}'

$(VENV)/.torch:
	$(PYTHON) -m venv --system-site-packages $(VENV)
	# Keep any torch the user already has (CUDA builds included); otherwise take the CPU wheel.
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "using existing torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	else \
		$(PY) -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "torch==$(TORCH_CPU_VERSION)"; \
	fi
	@touch $@

# everything: the package with the test, framework and report extras
$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install --quiet -e ".[dev,frameworks,report]" $(HOLD_TORCH)
	@touch $@ $(VENV)/.demo

# the demo needs the package and its own dependencies only (sentinel/demo/ imports torch,
# rich and the package): no test extras, no frameworks
$(VENV)/.demo: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install --quiet -e . $(HOLD_TORCH)
	@touch $@

setup: $(VENV)/.installed ## set up .venv with everything the tests need

setup-demo: $(VENV)/.demo ## set up .venv with only the package (what `make demo` needs)

# Prometheus, Alertmanager and promtool from Debian's packages, for the integration tests;
# Debian's chromium for the status-page tests (Playwright drives it; it never downloads a browser);
# slurm-wlm and munge for the one-node Slurm cluster tests/slurm.py starts.
system-deps: ## install Prometheus, Alertmanager, chromium, Slurm from Debian (for the tests)
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null || ! test -x /usr/bin/chromium \
	    || ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus prometheus-alertmanager \
			chromium slurm-wlm munge; \
	fi

demo: setup-demo ## run the live demo (DEMO_ARGS="--fault nan"; faults: none nan spike lr-high lr-low oscillate leak hang)
	$(VENV)/bin/sentinel demo $(DEMO_ARGS)

test: setup system-deps lint ## lint, type-check and run the suite (not the `slow` part)
	$(PY) -m mypy
	$(PY) -m pytest -q -m "not slow"

# the slow part (a Slurm time limit, the dashboards in the fleet profile): .ci/run runs it too
test-slow: setup system-deps ## run the tests marked slow (the program zoo, Slurm, the fleet profile, a few long runs)
	$(PY) -m pytest -q -m slow

lint: setup ## ruff, configured in pyproject.toml
	$(PY) -m ruff check .

typecheck: setup ## mypy over the package
	$(PY) -m mypy

docs: setup-demo ## rewrite the generated pages: docs/metrics.md, rules.md, configuration.md
	$(PY) -m sentinel.docs

bench: setup ## run the benchmarks (installs the `bench` extra: the peers they compare against)
	$(PY) -m pip install --quiet -e ".[bench]" $(HOLD_TORCH)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/peers.py
	$(PY) benchmarks/detection.py
	$(PY) benchmarks/daemon.py
	$(PY) benchmarks/alert_latency.py

clean: ## remove .venv and the build outputs
	rm -rf $(VENV) build *.egg-info
