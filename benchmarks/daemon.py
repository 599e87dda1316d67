"""The daemon at node scale: ingest throughput, scrape time, and memory over a long run.

The frames are those of a real 64-group model (an MLP of 63 blocks and a head, AdamW with
a GradScaler) recorded by the monitor itself, as ``benchmarks/detection.py`` does. Steps
201-300 of that run (past the first fast descent, so the values are near stationary)
become templates that repeat with a period of 100 steps: the fields each step carries
(grad sums of squares every step; parameter and update sums of squares, the SNR sums and
memory every 10; optimizer state bytes every 100) are exactly the monitor's. CUDA
allocator figures are added to the memory fields so every family of a GPU run exists.
Each simulated step is sent by 8 ranks, interleaved as a node sends them, with ``step``
advancing and ``t`` the wall clock at encoding.

Part 1, ingest: frames per second and microseconds per frame with the full default rule
pack (and, as a baseline in the same run, with every rule disabled), through
:meth:`Engine.feed` in a process pinned to one core, and through the real daemon path (a
Unix datagram socket → :class:`DatagramListener` → :class:`Service` queue and worker),
the daemon pinned to that core and the frames sent, as ranks send them, by another
process (on another core when there is one); and through :meth:`Engine.feed` with the
history recorder attached (its writer thread on the same core, every frame committed), as
the daemon runs by default. Target: >= 20,000 frames/s with the full pack and history.

Part 1b, stages (``--only stages``): the CPU time of each stage of a frame (decode and
validate, ingest, rules, history offer and writer), the engine's methods wrapped; see
docs/performance.md.

Part 2, scrape: an engine filled with 64 ranks x 64 groups, served by the real
:class:`Service` HTTP server; the median of repeated ``GET /metrics`` in the Prometheus
text format and in OpenMetrics. Target: <= 100 ms.

Part 3, memory: a real ``sentinel daemon`` process receives ``--steps`` simulated steps
from 8 ranks (8 frames a step, each a full 64-group report) over its socket; its RSS is
read from ``/proc/<pid>/statm`` at checkpoints. The sender keeps at most a few thousand
frames in flight (it reads the daemon's own ``sentinel_daemon_*`` counters), so no frame
is dropped and every simulated step is ingested and judged by the rules. It must stay
flat and bounded. Both processes are pinned to the same core.

Part 5, decode (``--only decode``): decoding and checking alone, per frame of part 1's
workload, CPU time of this process: the strict decode into ``wire.Frame`` with
``validate.fits`` and the map the engine ingests (the fast path, every frame a real
instrument sends), against the map decode with ``validate.check_frame`` field by field (the
path of a frame the strict decode refuses, and until issue 19 the path of every frame);
interleaved, medians.

Part 4, vanish (``benchmarks/vanish.py``): 2,000 reporting processes killed at once; the
delay an unrelated frame sees meanwhile, and the time until every crash is recorded.

Nothing here asserts: it prints tables and exits 0.

Usage::

    python benchmarks/daemon.py                       # all three parts, 100,000 steps in part 3
    python benchmarks/daemon.py --only rss --steps 1000000 --every 100000
    python benchmarks/daemon.py --only ingest scrape --markdown
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import random
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from detection import record, render  # noqa: E402  (a sibling script, not a package)

from sentinel import wire  # noqa: E402
from sentinel.config import load_config  # noqa: E402
from sentinel.daemon.daemon import Daemon  # noqa: E402
from sentinel.daemon.service import Service, attach_history  # noqa: E402
from sentinel.engine.engine import Engine  # noqa: E402
from sentinel.history.recorder import Recorder  # noqa: E402
from sentinel.rules.config import RulePack, default_rules, load_pack  # noqa: E402

GROUPS = 64
RANKS = 8
PERIOD = 100  # the templates' period in steps: the monitor's state_every
TARGET_FPS = 20_000
TARGET_SCRAPE_MS = 100.0
GIB = 2**30
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


# -- the workload --------------------------------------------------------------------------


class Workload:
    """Frames of a real 64-group run, replayable for any step and rank."""

    def __init__(self, seed: int = 0) -> None:
        frames, groups = record(3 * PERIOD, amp=True, seed=seed)
        decoded = [wire.decode(d) for d in frames]
        steps = [f for f in decoded if f["kind"] == "step"]
        self.templates = steps[2 * PERIOD: 3 * PERIOD]  # steps 201..300
        self.groups = groups
        for f in self.templates:
            del f["v"]  # encode adds it back
            mem = f.get("mem")
            if isinstance(mem, dict):  # what a GPU run reports besides the host figures
                mem.update(cuda_allocated=30 * GIB, cuda_reserved=40 * GIB, cuda_peak=36 * GIB,
                           cuda_total=80 * GIB, cuda_retries=0, cuda_ooms=0)

    def frame(self, step: int, rank: int, run: str = "bench", world: int = RANKS, report: int = 0) -> bytes:
        """The encoded report of ``rank`` at ``step`` (1-based); ``report`` picks the template
        (the step by default), so the fields follow the monitor's cadence in reports."""
        f = dict(self.templates[((report or step) - 1) % PERIOD])
        f.update(step=step, rank=rank, world=world, run=run, t=time.time())
        return wire.encode(f)

    def stream(self, first: int, last: int, ranks: int = RANKS, run: str = "bench") -> Iterator[bytes]:
        """Steps ``first..last`` of every rank, interleaved step by step."""
        for step in range(first, last + 1):
            for rank in range(ranks):
                yield self.frame(step, rank, run, world=ranks)


def _no_rules() -> RulePack:
    return load_pack({"rules": {r["name"]: {"enabled": False} for r in default_rules()}})


def _quiet_config() -> Any:
    config, _ = load_config({"gpu": {"enabled": False}})
    return config


def _pin(cpu: int | None, pid: int = 0) -> str:
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return "unpinned"
    os.sched_setaffinity(pid, {cpu})
    return f"cpu {cpu}"


# -- part 1: ingest throughput -------------------------------------------------------------


def _through_engine(warm: list[bytes], timed: list[bytes], pack: RulePack, history: bool = False,
                    clock: Callable[[], float] = time.perf_counter,
                    prepare: Callable[[Engine], object] | None = None) -> float:
    """Seconds (of ``clock``) to feed ``timed``; with ``history``, a :class:`Recorder` on a
    fresh file is attached as the daemon attaches it, and the time includes its writer
    thread's commit of every frame (the same core: the writer's work is the daemon's).
    ``prepare`` is given the engine after the warm-up frames, before the timed ones."""
    engine = Engine(pack=pack)
    with tempfile.TemporaryDirectory() as tmp:
        recorder = Recorder(os.path.join(tmp, "history.sqlite")) if history else None
        if recorder is not None:
            attach_history(engine, recorder)
        try:
            for data in warm:
                engine.feed(data)
            if recorder is not None:
                recorder.flush(60)
            if prepare is not None:
                prepare(engine)
            gc.collect()
            t0 = clock()
            for data in timed:
                engine.feed(data)
            if recorder is not None:
                assert recorder.flush(60)
            dt = clock() - t0
        finally:
            if recorder is not None:
                recorder.close()
    assert engine.frames_malformed == 0
    return dt


def _timed(fn: Any, into: dict[str, float], key: str) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            into[key] += time.thread_time() - t0
    return wrapper


def _stages(warm: list[bytes], timed: list[bytes]) -> dict[str, float]:
    """CPU seconds per stage of :meth:`Engine.feed` over ``timed``, full default pack and
    history on: the engine's own methods wrapped (about 0.5 µs a call of overhead each)."""
    engine = Engine()
    acc = dict.fromkeys(("feed", "ingest", "store and rules", "rules", "history offer", "history writer"), 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        recorder = Recorder(os.path.join(tmp, "history.sqlite"))
        attach_history(engine, recorder)
        try:
            for data in warm:
                engine.feed(data)
            recorder.flush(60)
            engine.ingestor.ingest = _timed(engine.ingestor.ingest, acc, "ingest")  # type: ignore[method-assign]
            engine.ingest = _timed(engine.ingest, acc, "store and rules")  # type: ignore[method-assign]
            engine.rules.evaluate = _timed(engine.rules.evaluate, acc, "rules")  # type: ignore[method-assign]
            engine.frame_listeners[:] = [_timed(f, acc, "history offer") for f in engine.frame_listeners]
            gc.collect()
            p0, t0 = time.process_time(), time.thread_time()
            for data in timed:
                engine.feed(data)
            acc["feed"] = time.thread_time() - t0
            assert recorder.flush(60)
            acc["history writer"] = time.process_time() - p0 - (time.thread_time() - t0)
        finally:
            recorder.close()
    return acc


def stages(work: Workload, steps: int, repeats: int, markdown: bool) -> None:
    """Where a frame's time goes (medians of ``repeats`` runs), each stage alone."""
    warm = list(work.stream(1, PERIOD))
    timed = list(work.stream(PERIOD + 1, PERIOD + steps))
    runs = [_stages(warm, timed) for _ in range(repeats)]
    us = {k: 1e6 * statistics.median(r[k] for r in runs) / len(timed) for k in runs[0]}
    rows = [["stage", "us/frame (median)", "share of a frame"],
            ["decode and validate (wire.decode, check_frame, admission)",
             f"{us['feed'] - us['store and rules'] - us['history offer']:.1f}", ""],
            ["ingest (Ingestor.ingest: frame -> store)", f"{us['ingest']:.1f}", ""],
            ["rules (RuleEngine.evaluate, cross-rank re-evaluations included)", f"{us['rules']:.1f}", ""],
            ["engine bookkeeping (Engine.ingest less the two above)",
             f"{us['store and rules'] - us['ingest'] - us['rules']:.1f}", ""],
            ["history offer (the frame listener: a queue append)", f"{us['history offer']:.1f}", ""],
            ["history writer (its thread: SQLite, every frame committed)", f"{us['history writer']:.1f}", ""]]
    total = us["feed"] + us["history writer"]
    for row in rows[1:]:
        row[2] = f"{100 * float(row[1]) / total:.0f}%"
    rows.append(["total (one core)", f"{total:.1f}", f"{1e6 / total:,.0f} frames/s"])
    print(render(rows, markdown))
    print(f"\nCPU time (thread_time of the engine's thread; the writer thread's from process_time), full default "
          f"pack, history on; {repeats} runs of {len(timed)} frames after {PERIOD} warm-up steps")


_SENDER = """
import os, socket, struct, sys
path, frames, cpu = sys.argv[1], sys.argv[2], int(sys.argv[3])
if cpu >= 0:
    os.sched_setaffinity(0, {cpu})
data = open(frames, "rb").read()
out, i = [], 0
while i < len(data):
    (n,) = struct.unpack_from("<I", data, i)
    out.append(data[i + 4:i + 4 + n])
    i += 4 + n
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # blocking: waits, never drops
sock.connect(path)
sys.stdin.readline()  # go
for d in out:
    sock.send(d)
"""


def _other_cpu() -> int:
    """A core for the senders other than the daemon's (-1: there is only one)."""
    cpus = sorted(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ())
    mine = cpus[0] if cpus else -1
    others = [c for c in range(os.cpu_count() or 1) if c != mine]
    return others[0] if others else -1


def _through_daemon(warm: list[bytes], timed: list[bytes], pack: RulePack) -> tuple[float, int]:
    """Seconds from the first timed send until the worker ingested the last frame; drops.
    The frames come from another process, as the ranks' do."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s", "engine.sock")
        frames = os.path.join(tmp, "frames")
        with open(frames, "wb") as f:
            for data in timed:
                f.write(struct.pack("<I", len(data)) + data)
        daemon = Daemon(_quiet_config(), pack, "127.0.0.1:0", path)
        sender = subprocess.Popen([sys.executable, "-c", _SENDER, path, frames, str(_other_cpu())],
                                  stdin=subprocess.PIPE, text=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.connect(path)
        try:
            for data in warm:
                sock.send(data)
            daemon.service.flush(60)
            gc.collect()
            service = daemon.service
            base = service.processed + service.dropped
            assert sender.stdin is not None
            t0 = time.perf_counter()
            sender.stdin.write("go\n")
            sender.stdin.flush()
            while service.processed + service.dropped < base + len(timed):
                time.sleep(0.0005)
            dt = time.perf_counter() - t0
            assert service.engine.frames_malformed == 0
            sender.wait(60)
            return dt, service.dropped
        finally:
            if sender.poll() is None:
                sender.kill()
                sender.wait()
            sock.close()
            daemon.stop()


def ingest(work: Workload, steps: int, repeats: int, markdown: bool) -> None:
    warm = list(work.stream(1, PERIOD))  # rules past their warm-up, windows filling
    timed = list(work.stream(PERIOD + 1, PERIOD + steps))
    packs = {"full default": load_pack(), "full default + history": load_pack(),
             "all disabled (ingest only)": _no_rules()}
    seconds: dict[tuple[str, str], list[float]] = {}
    drops = 0
    for r in range(repeats):  # ABBA, so drift in the machine's load cancels
        order = list(packs) if r % 2 == 0 else list(reversed(packs))
        for label in order:
            history = label.endswith("+ history")
            seconds.setdefault(("Engine.feed", label), []).append(
                _through_engine(warm, timed, packs[label], history))
            if history:
                continue  # the daemon path has history on already (the config's default)
            dt, dropped = _through_daemon(warm, timed, packs[label])
            seconds.setdefault(("socket -> listener -> Service", label), []).append(dt)
            drops += dropped
    rows = [["path", "pack", "frames", "frames/s (median)", "us/frame (median)", "frames/s (worst)", "target"]]
    for (path, label), ts in seconds.items():
        med, worst = statistics.median(ts), max(ts)
        met = "" if not label.startswith("full default") else ("met" if len(timed) / med >= TARGET_FPS else "NOT met")
        rows.append([path, label, str(len(timed)), f"{len(timed) / med:,.0f}", f"{1e6 * med / len(timed):.1f}",
                     f"{len(timed) / worst:,.0f}", f">= {TARGET_FPS:,} {met}".rstrip()])
    print(render(rows, markdown))
    print(f"\n{repeats} repeats of {steps} steps x {RANKS} ranks ({len(timed)} frames of {work.groups} groups, "
          f"{statistics.fmean(len(d) for d in timed):.0f} bytes on average) after {PERIOD} warm-up steps; "
          f"frames dropped on the daemon path: {drops}")


# -- part 5: decode and check alone -----------------------------------------------------------


def decode(work: Workload, repeats: int, markdown: bool) -> None:
    import msgpack
    import msgspec

    from sentinel.engine.validate import Limits, check_frame, fits

    frames = list(work.stream(1, PERIOD))
    limits = Limits()

    def strict() -> None:
        for data in frames:
            f = wire.decode_strict(data)
            assert fits(f, limits)
            wire.as_map(f)

    def by_field() -> None:
        for data in frames:
            assert not check_frame(wire.decode(data), limits)

    nan = []  # each frame with a NaN gradient sum: the strict decode refuses it
    for data in frames:
        f = wire.decode(data)
        if f.get("grad_sumsq"):
            f["grad_sumsq"] = [float("nan")] + f["grad_sumsq"][1:]
        nan.append(msgpack.packb(f))

    def refused_then_by_field() -> None:
        for data in nan:
            try:
                wire.decode_strict(data)
            except msgspec.ValidationError:
                pass
            assert not check_frame(wire.decode(data), limits)

    paths = {"strict decode + fits + map (fast path)": strict, "map decode + check_frame (field by field)": by_field,
             "a NaN sum: strict refuses, then field by field": refused_then_by_field}
    seconds: dict[str, list[float]] = {k: [] for k in paths}
    for r in range(max(repeats, 5)):
        for label in (list(paths) if r % 2 == 0 else list(reversed(paths))):
            gc.collect()
            t0 = time.process_time()
            paths[label]()
            seconds[label].append(time.process_time() - t0)
    rows = [["path", "frames", "frames/s (median)", "us/frame (median)"]]
    for label, ts in seconds.items():
        med = statistics.median(ts)
        rows.append([label, str(len(frames)), f"{len(frames) / med:,.0f}", f"{1e6 * med / len(frames):.1f}"])
    print(render(rows, markdown))
    print(f"\n{len(frames)} frames of {work.groups} groups x {max(repeats, 5)} repeats, CPU time of this process")


# -- part 2: scrape time ---------------------------------------------------------------------


def _get(url: str, accept: str | None) -> tuple[float, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        body = r.read()
    return time.perf_counter() - t0, body


def scrape(work: Workload, ranks: int, steps: int, repeats: int, markdown: bool) -> None:
    service = Service(_quiet_config(), load_pack(), "127.0.0.1:0")
    try:
        t0 = time.perf_counter()
        for data in work.stream(1, steps, ranks=ranks):  # straight into the engine: the worker idles
            service.engine.feed(data)
        fill = time.perf_counter() - t0
        url = service.url + "/metrics"
        formats = {"Prometheus text 0.0.4": None, "OpenMetrics 1.0": OPENMETRICS}
        times: dict[str, list[float]] = {k: [] for k in formats}
        bodies: dict[str, bytes] = {}
        for k, accept in formats.items():
            _, bodies[k] = _get(url, accept)  # warm-up
        for r in range(repeats):
            order = list(formats) if r % 2 == 0 else list(reversed(formats))
            for k in order:
                dt, bodies[k] = _get(url, formats[k])
                times[k].append(dt)
        rows = [["format", "series", "body bytes", "median ms", "p90 ms", "max ms", "target"]]
        for k, ts in times.items():
            q = sorted(1e3 * t for t in ts)
            lines = [ln for ln in bodies[k].split(b"\n") if ln and not ln.startswith(b"#")]
            med = statistics.median(q)
            rows.append([k, f"{len(lines):,}", f"{len(bodies[k]):,}", f"{med:.1f}", f"{q[int(0.9 * (len(q) - 1))]:.1f}",
                         f"{q[-1]:.1f}", f"<= {TARGET_SCRAPE_MS:g} {'met' if med <= TARGET_SCRAPE_MS else 'NOT met'}"])
        print(render(rows, markdown))
        alerts = sum(1 for a in service.engine.alerts_json() if a.get("state") == "firing")
        print(f"\n{ranks} ranks x {work.groups} groups, {steps} steps each ({ranks * steps:,} frames fed in "
              f"{fill:.1f} s); {repeats} scrapes per format over loopback HTTP, alternating; "
              f"alerts firing: {alerts}")
    finally:
        service.stop()


# -- part 3: memory over a long run -----------------------------------------------------------


def _statm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_SAMPLE = re.compile(rb"^(sentinel_daemon_\w+|sentinel_alert_firing)(\{[^}]*\})? (\S+)$", re.M)


def _health(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    out: dict[str, float] = {}
    for name, labels, value in _SAMPLE.findall(body):
        key = name.decode()
        out[key] = out.get(key, 0.0) + float(value) if labels else float(value)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss(work: Workload, steps: int, every: int, stride: int, cpu: int | None, markdown: bool) -> None:
    tmp = tempfile.mkdtemp(prefix="sentinel-bench-")
    path, port = os.path.join(tmp, "s", "engine.sock"), _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "daemon", "--socket", path,
                             "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(tmp, "daemon.log"), "wb"))
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        _pin(cpu, proc.pid)
        deadline = time.monotonic() + 60
        while True:
            try:
                _health(url)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the daemon did not come up") from None
                time.sleep(0.1)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.connect(path)
        rows = [["steps", "frames", "RSS MiB (/proc)", "RSS MiB (own metric)", "frames/s since last",
                 "rule verdicts", "alerts firing", "queue", "dropped"]]
        rss0, own0 = _statm_rss(proc.pid), _health(url)["sentinel_daemon_resident_memory_bytes"]
        rows.append(["0", "0", f"{rss0 / 2**20:.1f}", f"{own0 / 2**20:.1f}", "-", "0", "0", "0", "0"])
        print("  " + " | ".join(rows[0]), file=sys.stderr, flush=True)
        sent, received, last_t, last_n = 0, 0.0, time.perf_counter(), 0
        samples: list[tuple[int, int]] = []
        for report in range(1, steps // stride + 1):
            step = report * stride
            for rank in range(RANKS):
                sock.send(work.frame(step, rank, report=report))
            sent += RANKS
            if sent - received > 4096:  # keep the daemon's queue (8192) from overflowing
                while True:
                    h = _health(url)
                    received = h["sentinel_daemon_frames_received_total"] + h["sentinel_daemon_frames_dropped_total"]
                    if sent - received <= 1024:
                        break
                    time.sleep(0.01)
            if step % every == 0 or report == steps // stride:
                while True:  # wait until the daemon caught up, so the row shows this step
                    h = _health(url)
                    if h["sentinel_daemon_frames_received_total"] + h["sentinel_daemon_frames_dropped_total"] >= sent:
                        break
                    time.sleep(0.01)
                received = sent
                now = time.perf_counter()
                mem = _statm_rss(proc.pid)
                samples.append((step, mem))
                row = [f"{step:,}", f"{sent:,}", f"{mem / 2**20:.1f}",
                       f"{h['sentinel_daemon_resident_memory_bytes'] / 2**20:.1f}",
                       f"{(sent - last_n) / (now - last_t):,.0f}",
                       f"{h['sentinel_daemon_rule_evaluations_total']:,.0f}",
                       f"{h.get('sentinel_alert_firing', 0):.0f}", f"{h['sentinel_daemon_queue_depth']:.0f}",
                       f"{h['sentinel_daemon_frames_dropped_total']:.0f}"]
                rows.append(row)
                print("  " + " | ".join(row), file=sys.stderr, flush=True)
                last_t, last_n = now, sent
        sock.close()
        print(render(rows, markdown))
        if len(samples) >= 3:
            ref_step, ref = samples[len(samples) // 5]
            top = max(m for _, m in samples[len(samples) // 5:])
            what = f"{steps:,} simulated steps" if stride == 1 else \
                f"{steps:,} simulated steps, one report every {stride} steps,"
            pinned = f"pinned to cpu {cpu}" if cpu is not None else "unpinned"
            print(f"\n{what} x {RANKS} ranks = {sent:,} frames of {work.groups} groups into a "
                  f"real `sentinel daemon` (pid {proc.pid}, {pinned}); "
                  f"RSS at step {ref_step:,}: {ref / 2**20:.1f} MiB, highest after it: {top / 2**20:.1f} MiB "
                  f"(+{(top - ref) / 2**20:.1f} MiB, {100 * (top - ref) / ref:+.1f}%); "
                  f"at the end: {samples[-1][1] / 2**20:.1f} MiB; daemon log: {tmp}/daemon.log")
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=["ingest", "stages", "decode", "scrape", "rss", "vanish"], default=[],
                    help="parts to run (default: all)")
    ap.add_argument("--ingest-steps", type=int, default=500, help="timed steps x 8 ranks in part 1 (default 500)")
    ap.add_argument("--repeats", type=int, default=4, help="repeats per pack in part 1 (default 4)")
    ap.add_argument("--ranks", type=int, default=64, help="ranks in part 2 (default 64)")
    ap.add_argument("--scrape-steps", type=int, default=PERIOD, help="steps per rank in part 2 (default 100)")
    ap.add_argument("--scrapes", type=int, default=20, help="scrapes per format in part 2 (default 20)")
    ap.add_argument("--steps", type=int, default=100_000, help="simulated steps x 8 ranks in part 3 (default 100,000)")
    ap.add_argument("--every", type=int, default=0, help="checkpoint every N steps in part 3 (default steps/10)")
    ap.add_argument("--stride", type=int, default=1,
                    help="steps between two reports of a rank in part 3 (default 1: a report every step)")
    ap.add_argument("--cpu", type=int, default=None,
                    help="core to pin to (default: the first this process may use; -1: do not pin)")
    ap.add_argument("--markdown", action="store_true", help="print tables as markdown")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the benchmark's own alerts are not news
    torch.set_num_threads(1)
    random.seed(0)
    cpu = None if args.cpu == -1 else (args.cpu if args.cpu is not None else min(os.sched_getaffinity(0)))
    where = _pin(cpu)
    parts = args.only or ["ingest", "stages", "scrape", "rss", "vanish"]
    work = Workload()
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {where}; rule pack: built-in default; "
          f"frames recorded from a real {work.groups}-group model (AdamW + GradScaler)", flush=True)
    if "ingest" in parts:
        print(f"\n== ingest throughput: {work.groups}-group reports from {RANKS} ranks ==\n", flush=True)
        ingest(work, args.ingest_steps, args.repeats, args.markdown)
    if "stages" in parts:
        print(f"\n== where a frame's time goes: {work.groups}-group reports from {RANKS} ranks ==\n", flush=True)
        stages(work, args.ingest_steps, args.repeats, args.markdown)
    if "decode" in parts:
        print(f"\n== decode and check alone: {work.groups}-group reports ==\n", flush=True)
        decode(work, args.repeats, args.markdown)
    if "scrape" in parts:
        print(f"\n== scrape time: {args.ranks} ranks x {work.groups} groups ==\n", flush=True)
        scrape(work, args.ranks, args.scrape_steps, args.scrapes, args.markdown)
    if "rss" in parts:
        every = args.every or max(args.stride, args.steps // 10 // args.stride * args.stride)
        print(f"\n== daemon memory: {args.steps:,} simulated steps from {RANKS} ranks ==\n", flush=True)
        rss(work, args.steps, every, args.stride, cpu, args.markdown)
    if "vanish" in parts:  # part 4 (vanish.py): crash detection when many processes die at once
        from vanish import HEADER, vanish

        print("\n== 2,000 reporting processes vanishing at once: the delay of an unrelated frame ==\n", flush=True)
        print(render([HEADER, vanish(kill=False), vanish()], args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
