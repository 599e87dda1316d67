"""The NVML poller. No GPU or driver exists on the CI machines, so these tests hand the
poller a stand-in for the ``pynvml`` module (the one place a fake is allowed); on a GPU
machine, tests/gpu exercises the real library."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sentinel.daemon.gpu import GpuPoller
from sentinel.store import Store, labels_of


class FakeNvml:
    """Two GPUs; GPU 1 runs hot, is thermally throttled, has 2 uncorrected ECC errors and one XID 79."""

    def __init__(self) -> None:
        self.events = [SimpleNamespace(device="h1", eventData=79)]

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetUUID(self, h: str) -> bytes:
        return f"GPU-{h}".encode()

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, h: str, mask: int, events: object) -> None:
        pass

    def nvmlEventSetWait(self, events: object, timeout_ms: int) -> Any:
        if not self.events:
            raise RuntimeError("NVML_ERROR_TIMEOUT")
        return self.events.pop()

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=97)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(used=70 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 91 if h == "h1" else 60

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 650_000

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: str) -> int:
        return 0x40 if h == "h1" else 0

    def nvmlDeviceGetTotalEccErrors(self, h: str, kind: int, counter: int) -> int:
        if h == "h1" and kind == 1:
            return 2
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # corrected counts unsupported: skipped


def test_poll_exports_labelled_gpu_series() -> None:
    store = Store()
    poller = GpuPoller(store, FakeNvml(), interval=60, hostname="node-a")
    poller.poll()
    hot = labels_of(gpu="1", UUID="GPU-h1", Hostname="node-a")
    assert store.last("sentinel_gpu_temperature_celsius", hot)[2] == 91  # type: ignore[index]
    assert store.last("sentinel_gpu_utilization_ratio", hot)[2] == 0.97  # type: ignore[index]
    assert store.last("sentinel_gpu_power_watts", hot)[2] == 650.0  # type: ignore[index]
    throttled = tuple(sorted(hot + (("reason", "hw_thermal_slowdown"),)))
    assert store.last("sentinel_gpu_clock_throttled", throttled)[2] == 1.0  # type: ignore[index]
    assert store.counter("sentinel_gpu_ecc_errors_total", tuple(sorted(hot + (("type", "uncorrected"),)))) == 2
    assert store.counter("sentinel_gpu_xid_errors_total", hot) == 1
    assert store.last("sentinel_gpu_last_xid", hot)[2] == 79  # type: ignore[index]
    assert store.counter("sentinel_gpu_xid_errors_total", labels_of(gpu="0", UUID="GPU-h0", Hostname="node-a")) == 0
    model = tuple(sorted(hot + (("model", "NVIDIA H100 80GB HBM3"),)))
    assert store.last("sentinel_gpu_info", model)[2] == 1.0  # type: ignore[index]
    assert list(poller.rows()) == [("sentinel_gpu_monitoring_up", "gauge", (), 1.0)]


def test_without_a_driver_only_up_is_exported() -> None:
    store = Store()
    poller = GpuPoller(store, None)
    poller.poll()
    assert store.names() == []
    assert list(poller.rows()) == [("sentinel_gpu_monitoring_up", "gauge", (), 0.0)]


def test_gpu_rules_fire_for_the_hot_gpu_its_xid_and_its_ecc_errors() -> None:
    """The engine judges the poller's series on its tick: GPU 1 (91 °C, XID 79, 2
    uncorrected ECC errors) fires all three rules, naming the GPU and its UUID; GPU 0 none."""
    from sentinel.engine.engine import Engine

    now = [1000.0]
    engine = Engine(clock=lambda: now[0], node="node-a")
    nvml = FakeNvml()
    poller = GpuPoller(engine.store, nvml, interval=60, clock=lambda: now[0])
    for _ in range(3):  # GPUOverheating needs 3 polls in a row
        poller.poll()
        now[0] += 5
        engine.tick()
    alerts = {a["alertname"]: a for a in engine.alerts_json()}
    assert set(alerts) == {"GPUOverheating", "GPUXidError", "GPUEccErrors"}
    for a in alerts.values():
        assert a["state"] == "firing" and a["job"] == "node" and a["run"] == engine.node
        assert a["groups"] == ["GPU 1 (GPU-h1)"] and a["ranks"] == []
    assert alerts["GPUOverheating"]["summary"] == f"GPU overheating on {engine.node}: GPU 1 (GPU-h1) at 91 °C (limit 85 °C)"
    assert alerts["GPUXidError"]["value"] == 79 and "GPU XID 79" in alerts["GPUXidError"]["summary"]
    assert alerts["GPUEccErrors"]["value"] == 2
    # no new XID or ECC error for 60 polls resolves those two; the heat goes on
    for _ in range(60):
        poller.poll()
        now[0] += 5
        engine.tick()
    firing = {a["alertname"] for a in engine.alerts_json() if a["state"] == "firing"}
    assert firing == {"GPUOverheating"}


def test_the_real_nvml_bindings_without_a_driver_report_up_0() -> None:
    """nvidia-ml-py is a default dependency: on a machine without a driver (these CI
    machines) loading it fails soft and only ``sentinel_gpu_monitoring_up 0`` is exported."""
    import importlib.util

    from sentinel.daemon.gpu import load_nvml

    assert importlib.util.find_spec("pynvml") is not None  # installed by default
    nvml = load_nvml()
    if nvml is not None:  # a GPU machine: tests/gpu covers the real library
        return
    store = Store()
    poller = GpuPoller(store, nvml)
    poller.poll()
    assert store.names() == [] and list(poller.rows()) == [("sentinel_gpu_monitoring_up", "gauge", (), 0.0)]
