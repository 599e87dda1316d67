"""NVML poller: GPU utilisation, memory, temperature, power, throttle reasons, ECC and XID.

Series carry ``gpu`` (index), ``UUID`` and ``Hostname`` labels, as dcgm-exporter's do, so
dashboards can join the two. Without a driver (or without ``nvidia-ml-py``) ``sentinel_gpu_monitoring_up``
is 0 and nothing else changes. The NVML module is passed in so tests can hand a stand-in
where no GPU exists.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sentinel.store import Store, labels_of

log = logging.getLogger("sentinel")

THROTTLE_REASONS = {  # nvmlClocksEventReason* bits worth a page
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
}
XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError


def load_nvml() -> Any | None:
    """``pynvml`` from nvidia-ml-py, initialised; None without a driver or the package."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


class GpuPoller:
    """Polls every GPU every ``interval`` seconds into the store, from a thread.

    Args:
        store: where series go.
        nvml: an initialised ``pynvml`` module, or None (then only ``up = 0`` is exported).
        interval: seconds between polls.
        clock: wall clock.
        hostname: the ``Hostname`` label (dcgm-exporter's name for the node), the host's
            name by default.
    """

    def __init__(self, store: Store, nvml: Any | None, interval: float = 5.0,
                 clock: Callable[[], float] = time.time, hostname: str | None = None) -> None:
        self.store, self.nvml, self.interval, self.clock = store, nvml, interval, clock
        self.hostname = hostname or socket.gethostname()
        self.devices: list[tuple[str, str, Any]] = []  # (index, uuid, handle)
        self._events: Any = None
        self.polls = 0
        self._ecc_last: dict[str, float] = {}  # uncorrected ECC total per GPU, at the last poll
        if nvml is not None:
            try:
                for i in range(nvml.nvmlDeviceGetCount()):
                    h = nvml.nvmlDeviceGetHandleByIndex(i)
                    uuid = nvml.nvmlDeviceGetUUID(h)
                    self.devices.append((str(i), uuid.decode() if isinstance(uuid, bytes) else str(uuid), h))
                self._events = nvml.nvmlEventSetCreate()
                for _, _, h in self.devices:
                    try:
                        nvml.nvmlDeviceRegisterEvents(h, XID_EVENT, self._events)
                    except Exception:
                        pass  # not supported on this board: no XID events from it
            except Exception:
                log.warning("sentinel: NVML is present but could not list the GPUs", exc_info=True)
                self.nvml = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def up(self) -> bool:
        return self.nvml is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sentinel-nvml", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * self.interval + 1)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception:
                log.warning("sentinel: NVML poll failed", exc_info=True)

    def rows(self) -> Iterator[tuple[str, str, tuple[()], float]]:
        yield ("sentinel_gpu_monitoring_up", "gauge", (), 1.0 if self.up else 0.0)

    def poll(self) -> None:
        """One poll of every GPU, plus any XID events waiting."""
        if self.nvml is None:
            return
        nv, now = self.nvml, self.clock()
        self.polls += 1
        step = self.polls
        xids = self._drain_xid()
        for index, uuid, h in self.devices:
            labels = labels_of(gpu=index, UUID=uuid, Hostname=self.hostname)

            def put(name: str, read: Callable[[], float]) -> None:
                try:
                    self.store.add(name, labels, step, now, float(read()))
                except Exception:
                    pass  # that field is not supported here

            try:  # the model, for sentinel_environment_info's gpu_model to join on
                name = nv.nvmlDeviceGetName(h)
                model = (name.decode() if isinstance(name, bytes) else str(name))[:64]
                self.store.add("sentinel_gpu_info", tuple(sorted(labels + (("model", model),))), step, now, 1.0)
            except Exception:
                pass
            put("sentinel_gpu_utilization_ratio", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            put("sentinel_gpu_memory_used_bytes", lambda: nv.nvmlDeviceGetMemoryInfo(h).used)
            put("sentinel_gpu_memory_total_bytes", lambda: nv.nvmlDeviceGetMemoryInfo(h).total)
            put("sentinel_gpu_temperature_celsius", lambda: nv.nvmlDeviceGetTemperature(h, 0))
            put("sentinel_gpu_power_watts", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
            try:
                mask = int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
                for bit, reason in THROTTLE_REASONS.items():
                    self.store.add("sentinel_gpu_clock_throttled", tuple(sorted(labels + (("reason", reason),))),
                                   step, now, 1.0 if mask & bit else 0.0)
            except Exception:
                pass
            for kind, code in (("corrected", 0), ("uncorrected", 1)):
                try:  # volatile counters (since the last driver load)
                    total = float(nv.nvmlDeviceGetTotalEccErrors(h, code, 0))
                    self.store.set_counter("sentinel_gpu_ecc_errors_total",
                                           tuple(sorted(labels + (("type", kind),))), total)
                except Exception:
                    continue
                if kind == "uncorrected":  # what GPUEccErrors judges: new ones since the last poll
                    # (at the first poll, all since the driver loaded: they still need a reset)
                    new = max(0.0, total - self._ecc_last.get(uuid, 0.0))
                    self._ecc_last[uuid] = total
                    self.store.add("sentinel_gpu_ecc_uncorrected_new", labels, step, now, new)
            self.store.inc("sentinel_gpu_xid_errors_total", labels, 0.0)
            # what GPUXidError judges: the code of the last XID event since the last poll, or 0
            self.store.add("sentinel_gpu_xid_code", labels, step, now, xids.get(uuid, 0.0))

    def _drain_xid(self) -> dict[str, float]:
        """Take the XID events waiting; returns the last code per GPU UUID."""
        codes: dict[str, float] = {}
        if self._events is None or self.nvml is None:
            return codes
        index_of = {u: i for i, u, _ in self.devices}
        for _ in range(64):
            try:
                data = self.nvml.nvmlEventSetWait(self._events, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: nothing waiting
                return codes
            try:
                raw = self.nvml.nvmlDeviceGetUUID(data.device)
                uuid = raw.decode() if isinstance(raw, bytes) else str(raw)
            except Exception:
                uuid = "unknown"
            index = index_of.get(uuid, "unknown")
            labels = labels_of(gpu=index, UUID=uuid, Hostname=self.hostname)
            code = float(getattr(data, "eventData", 0))
            self.store.inc("sentinel_gpu_xid_errors_total", labels, 1.0)
            self.store.add("sentinel_gpu_last_xid", labels, self.polls, self.clock(), code)
            codes[uuid] = code
        return codes
