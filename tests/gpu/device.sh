#!/usr/bin/env bash
# The GPU checks in one run, for a machine with a CUDA device and its own torch (the device
# tool's H200 here): the tests in tests/gpu (no host sync on the hot path, CUDA memory
# metrics), then benchmarks/overhead.py on CUDA at GPT-2-medium size with a bf16 forward and
# at the CPU benchmark's small size, then where the hooks' host time goes (benchmarks/probe_profile.py).
# Logs go to $OUT (or ./gpu-out). `device.sh tests` runs
# the tests alone.
#
# Sentinel's dependencies that a machine with only torch lacks travel as wheels in .whl/ (not
# committed), made on a machine that reaches PyPI for the GPU machine's Python (3.12 here):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl msgspec==0.23.0 \
#     apprise requests-oauthlib oauthlib pydantic pydantic-core annotated-types typing-inspection \
#     typing-extensions pydantic-settings python-dotenv bcrypt
# (pydantic and pydantic-core at the versions that match each other).
set -u -o pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, msgspec, sentinel; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" | tee -a "$OUT/gpu.txt" || exit 1
nproc | tee -a "$OUT/gpu.txt"
t0=$SECONDS
# at DEBUG a failing test's log shows the traceback of each probe failure (the sync's site)
timeout 200 python3 -m pytest -q -p no:cacheprovider --log-level=DEBUG tests/gpu 2>&1 | tee "$OUT/tests.log"
echo "tests: ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
[ "${1:-}" = tests ] && exit 0
t0=$SECONDS
timeout 200 python3 benchmarks/overhead.py --device cuda --model gpt2-medium --bf16 --tokens 8192 16384 \
    --steps 20 --repeats 6 --warmup 5 --markdown 2>&1 | tee "$OUT/overhead-gpt2-medium.log"
echo "overhead gpt2-medium: ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
t0=$SECONDS
timeout 100 python3 benchmarks/overhead.py --device cuda --steps 20 --repeats 6 --warmup 5 --markdown 2>&1 \
    | tee "$OUT/overhead-small.log"
echo "overhead small: ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
t0=$SECONDS
timeout 150 python3 benchmarks/probe_profile.py --device cuda --model gpt2-medium --bf16 --tokens 8192 --steps 20 2>&1 \
    | tee "$OUT/probe-profile.log"
echo "probe profile: ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
