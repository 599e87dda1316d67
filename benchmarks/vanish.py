"""Many reporting processes vanishing at once: the delay an unrelated frame sees.

2,000 real processes (``sleep``) each report one frame to a real :class:`Service` (as
ranks of 2,000 single-process runs on one daemon, a sweep), the service learning each
sender's pid as the daemon's socket does. Then all are killed at once (SIGKILL, reaped,
so ``kill(pid, 0)`` fails) and an unrelated rank keeps sending a frame every few
milliseconds: the time from its ``submit`` until the engine has ingested it is the delay
the crash detection costs the ingest path. Also timed: until every crash is recorded.

Run by ``benchmarks/daemon.py --only vanish`` (or alone); prints a table, asserts nothing.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from detection import render  # noqa: E402  (a sibling script, not a package)

from sentinel import wire  # noqa: E402
from sentinel.config import SentinelConfig, load_config  # noqa: E402
from sentinel.daemon.service import Service  # noqa: E402


def _frame(run: str, step: int) -> bytes:
    return wire.encode({"kind": "step", "job": "sweep", "run": run, "rank": 0, "world": 1, "step": step,
                        "t": time.time(), "groups": ["a", "b", "c", "d"], "grad_sumsq": [1.0, 2.0, 3.0, 4.0],
                        "lr": [0.01], "scalars": {"loss": 1.0}, "errors": 0, "dropped": 0})


def _config() -> SentinelConfig:
    raw: dict[str, object] = {"gpu": {"enabled": False}}
    if "limits" in SentinelConfig.model_fields:  # room for the sweep (older engines had no caps)
        raw["limits"] = {"max_runs": 10_000, "max_series": 10_000_000}
    config, _ = load_config(raw)
    return config


def vanish(processes: int = 2000, probe_seconds: float = 4.0, kill: bool = True) -> list[str]:
    """Returns the table row: processes, probes, median/max delay, time to record all crashes.
    With ``kill`` False the processes stay alive: the baseline (the rules' once-a-second
    tick over that many ranks)."""
    _, pack = load_config(None)
    service = Service(_config(), pack, "127.0.0.1:0")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(processes):
            procs.append(subprocess.Popen(["sleep", "600"]))
        for i, p in enumerate(procs):
            service.submit(_frame(f"r{i}", 1), p.pid)
        service.submit(_frame("unrelated", 1), None)
        assert service.flush(120), "the engine did not take the reports"
        engine = service.engine
        assert len(engine.pids) == processes, len(engine.pids)
        for p in procs if kill else ():
            p.send_signal(signal.SIGKILL)
        for p in procs if kill else ():
            p.wait()
        gone_at = time.perf_counter()
        delays: list[float] = []
        step, all_recorded = 1, None
        while time.perf_counter() - gone_at < probe_seconds or all_recorded is None:
            step += 1
            t0 = time.perf_counter()
            service.submit(_frame("unrelated", step), None)
            while service.processed < service.received:
                time.sleep(0.0002)
            delays.append(time.perf_counter() - t0)
            if all_recorded is None and (len(engine.exited_ranks) >= processes or not kill):
                all_recorded = time.perf_counter() - gone_at
            if time.perf_counter() - gone_at > 120:
                break
            time.sleep(0.002)
        return [f"{processes} {'vanish at once' if kill else 'alive (baseline)'}", str(len(delays)), f"{1e3 * statistics.median(delays):.2f}",
                f"{1e3 * max(delays):.1f}",
                "-" if not kill else "never" if all_recorded is None else f"{all_recorded:.2f}"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        service.stop()


HEADER = ["processes", "probe frames", "delay median ms", "delay max ms", "all crashes recorded after s"]


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.ERROR)
    print(render([HEADER, vanish(kill=False), vanish()], "--markdown" in sys.argv))
