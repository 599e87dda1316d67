"""Detection quality of the built-in rule pack on real CPU runs, and the rules' cost.

Part 1 runs every scenario of :mod:`sentinel.demo.scenarios` (a small model trained on the
CPU with one injected fault, or none) and prints, per scenario, the expected alert, the
alerts that fired (first firing step) and the detection delay in steps; then the recall
over the faulty scenarios and the false alerts on the clean ones.

With ``--compare`` (the default) every scenario runs twice, under the pack as it was
before issue 20 (:data:`BEFORE`: the old spike sizes, no loss trend, no explosion check,
the stalled-start warning, two update
samples after an lr jump, memory forecasts only above half the capacity) and under
today's, and a second table gives per rule: faults detected, the median detection delay,
and false alarms (warning/critical on clean runs, or before the fault), before → after.

Part 2 times :meth:`Engine.feed` per frame with the full default pack, on frames recorded
from a real 64-group model (an MLP of 63 blocks and a head) trained with AdamW, in fp32
and with a GradScaler, replayed into fresh engines. The same frames fed to an engine whose
rules are all disabled give the ingest-only cost, so the difference is what the rules add.

Nothing here asserts: it prints tables and exits 0.

Usage::

    python benchmarks/detection.py              # everything
    python benchmarks/detection.py --no-cost    # the detection table only
    python benchmarks/detection.py --only nan-loss hang --markdown
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from sentinel.demo.scenarios import SCENARIOS, Scenario, ScenarioResult, run_scenario
from sentinel.demo.tasks import MLP, backward_and_step
from sentinel.engine.engine import Engine
from sentinel.instrument.monitor import Monitor
from sentinel.instrument.options import from_kwargs
from sentinel.rules.config import RulePack, default_rules, load_pack

BEFORE: dict[str, dict[str, Any]] = {
    "LossSpike": {"params": {"window": 50, "factor": 3.0, "z": 6.0}},
    "GradientSpike": {"params": {"window": 50, "factor": 10.0, "z": 6.0}},
    "LossRising": {"enabled": False},
    "EarlyLossExplosion": {"enabled": False},
    "EarlyLossRising": {"params": {"chunk": 10, "separation": 0.0}},
    "EarlyLossStalled": {"severity": "warning"},
    "UpdateRatioHigh": {"lr_for_steps": 0},
    "OOMRisk": {"params": {"horizon_steps": 0, "min_ratio": 0.5, "level": "median", "lookback": 0}},
    "MemoryCritical": {"params": {"min_ratio": 1.0, "level": "median", "lookback": 0,
                                  "horizon_seconds": 1800, "horizon_steps": 0}},
}
"""The rules as they were before issue 20, as overrides of today's pack. (The memory limit
read before was the root cgroup's file, else the machine's: on this machine the same.)"""
TARGET_US = 100.0  # rule evaluation per ingested frame, full default pack, 64 groups (issue 3)
GROUPS = 64


def render(rows: list[list[str]], markdown: bool) -> str:
    """A plain or markdown table; the first row is the header."""
    if markdown:
        out = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- part 1: detection -------------------------------------------------------------------


def _verdict(r: ScenarioResult) -> str:
    sc = r.scenario
    if r.problems():
        return "FALSE ALERT" if r.false_alerts else ("LATE" if r.detected else "MISSED")
    if sc.clean:
        return "quiet" if not r.firings else "quiet (info only)"
    return "quiet" if sc.quiet else "detected"


def _before(sc: Scenario) -> Scenario:
    return dataclasses.replace(sc, rules={**BEFORE, **sc.rules})


def per_rule(before: list[ScenarioResult], after: list[ScenarioResult], markdown: bool) -> None:
    """Per rule, before → after: faults detected (of those expecting it), median delay,
    false alarms (warning/critical on clean runs, or before the fault)."""
    names: dict[str, None] = {}
    for r in before + after:
        names.update(dict.fromkeys(r.scenario.expect))
        names.update(dict.fromkeys(f.alertname for f in r.false_alerts))

    def stats(results: list[ScenarioResult], rule: str) -> tuple[int, int, str, int]:
        due = [r for r in results if rule in r.scenario.expect]
        delays = []
        for r in due:
            hit = [f for f in r.firings if f.alertname == rule]
            if hit and r.fault_step is not None and 0 <= hit[0].step - r.fault_step <= r.scenario.max_delay:
                delays.append(hit[0].step - r.fault_step)
        false = sum(1 for r in results for f in r.false_alerts if f.alertname == rule)
        med = f"{statistics.median(delays):g}" if delays else "-"
        return len(due), len(delays), med, false

    rows = [["rule", "faults expecting it", "detected in time (before → after)",
             "median delay, steps (before → after)", "false alarms (before → after)"]]
    for rule in names:
        n, hb, db, fb = stats(before, rule)
        _, ha, da, fa = stats(after, rule)
        rows.append([rule, str(n), f"{hb} → {ha}", f"{db} → {da}", f"{fb} → {fa}"])
    print(render(rows, markdown))
    print()
    for label, results in (("before", before), ("after", after)):
        faulty = [r for r in results if r.scenario.expect]
        ok = [r for r in faulty if r.detected is not None and not [p for p in r.problems() if "false" not in p]]
        false = sum(len(r.false_alerts) for r in results if r.scenario.clean)
        print(f"{label}: {len(ok)}/{len(faulty)} faults detected in time; "
              f"{false} warning/critical alerts on {sum(r.scenario.clean for r in results)} clean runs")


def detection(names: Sequence[str], markdown: bool, compare: bool = True) -> None:
    chosen = [sc for sc in SCENARIOS if not names or sc.name in names]
    results: list[ScenarioResult] = []
    before: list[ScenarioResult] = []
    for sc in chosen:
        if compare:
            before.append(run_scenario(_before(sc)))
        results.append(run_scenario(sc))
        r = results[-1]
        print(f"  {sc.name}: {r.steps} steps in {r.seconds:.1f}s", file=sys.stderr, flush=True)
    head = ["scenario", "model/optimizer", "fault @step", "expected alert", "alerts fired (first step)",
            "delay (steps)", "target", "verdict"]
    rows = [head]
    for r in results:
        sc = r.scenario
        expected = " or ".join(sc.expect) if sc.expect else ("none at all" if sc.quiet else "no warning/critical")
        fired = ", ".join(f"{f.alertname}{'(info)' if f.severity == 'info' else ''}@{f.step}"
                          for f in r.firings) or "-"
        delay = "-" if r.delay is None else str(r.delay)
        if r.stall_seconds is not None:
            delay += f" ({r.stall_seconds:.0f} s silent)"
        target = f"<={sc.max_delay}" if sc.expect else "-"
        rows.append([sc.name, f"{sc.model}/{sc.optimizer}{'+amp' if sc.amp else ''}",
                     "-" if r.fault_step is None else str(r.fault_step), expected, fired, delay, target,
                     _verdict(r)])
    print(render(rows, markdown))
    print()
    faulty = [r for r in results if r.scenario.expect]
    hit = [r for r in faulty if r.detected is not None]
    in_time = [r for r in hit if not r.problems() or all("after the fault" not in p for p in r.problems())]
    clean = [r for r in results if r.scenario.clean]
    quiet = [r for r in results if r.scenario.quiet]
    false_clean = [(r.scenario.name, f) for r in clean for f in r.false_alerts]
    false_quiet = [(r.scenario.name, f) for r in quiet for f in r.false_alerts]
    info = [(r.scenario.name, f) for r in clean for f in r.info_alerts]
    if faulty:
        print(f"recall: {len(hit)}/{len(faulty)} faulty scenarios detected "
              f"({len(in_time)}/{len(faulty)} within their target delay)")
    print(f"false alerts on clean runs: {len(false_clean)} warning/critical over {len(clean)} runs"
          + "".join(f"\n  {n}: {f.alertname} ({f.severity}) at step {f.step}" for n, f in false_clean))
    if quiet:
        print(f"alerts on must-stay-quiet runs: {len(false_quiet)} over {len(quiet)} runs"
              + "".join(f"\n  {n}: {f.alertname} at step {f.step}" for n, f in false_quiet))
    print(f"info alerts on clean runs (tolerated): {len(info)}"
          + "".join(f"\n  {n}: {f.alertname} at step {f.step}" for n, f in info))
    problems = [(r.scenario.name, p) for r in results for p in r.problems()]
    if problems:
        print("problems:" + "".join(f"\n  {n}: {p}" for n, p in problems))
    if compare:
        print("\n== per rule, the pack before issue 20 → today's ==\n")
        per_rule(before, results, markdown)


# -- part 2: rule cost -------------------------------------------------------------------


class _Recorder:
    """A sender that keeps the encoded frames."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.dropped = 0

    def send(self, data: bytes) -> bool:
        self.frames.append(data)
        return True

    def close(self) -> None:
        pass


def record(steps: int, amp: bool, seed: int = 0) -> tuple[list[bytes], int]:
    """Frames of a real 64-group model (63 MLP blocks + head) trained with AdamW.

    Returns:
        The encoded frames and the number of groups the monitor formed.
    """
    torch.manual_seed(seed)
    model = MLP(width=8, depth=GROUPS - 1, inputs=8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu") if amp else None
    rec = _Recorder()
    mon = Monitor(model, [opt], from_kwargs({"engine": "off", "run": f"cost-{'amp' if amp else 'fp32'}"}),
                  sender=rec, scaler=scaler)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad(set_to_none=True)
        backward_and_step(loss, opt, scaler)
        mon.log(loss=loss)
    mon.close()
    return rec.frames, len(mon.groups)


def _no_rules() -> dict[str, Any]:
    return {"rules": {r["name"]: {"enabled": False} for r in default_rules()}}


def replay(frames: list[bytes], pack: RulePack) -> list[float]:
    """Seconds per :meth:`Engine.feed` for each frame, into a fresh engine (GC paused)."""
    engine = Engine(pack=pack)
    out: list[float] = []
    gc.collect()
    gc.disable()
    try:
        for data in frames:
            t0 = time.perf_counter()
            engine.feed(data)
            out.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return out


def cost(steps: int, repeats: int, markdown: bool) -> None:
    head = ["stream", "frames", "pack", "median us/frame", "mean us/frame", "p99 us/frame"]
    rows = [head]
    notes = []
    for amp in (False, True):
        frames, groups = record(steps, amp)
        name = f"{groups} groups, AdamW{' + GradScaler' if amp else ''}"
        packs = {"full default": load_pack(), "all disabled (ingest only)": load_pack(_no_rules())}
        timings: dict[str, list[float]] = {label: [] for label in packs}
        for r in range(repeats):  # alternate (ABBA) so drift in the machine's load cancels
            order = list(packs) if r % 2 == 0 else list(reversed(packs))
            for label in order:
                timings[label] += [1e6 * t for t in replay(frames, packs[label])]
        for label, ts in timings.items():
            q = sorted(ts)
            med, mean, p99 = statistics.median(q), statistics.fmean(q), q[int(0.99 * (len(q) - 1))]
            rows.append([name, str(len(frames)), label, f"{med:.1f}", f"{mean:.1f}", f"{p99:.1f}"])
        full, base = timings["full default"], timings["all disabled (ingest only)"]
        rule_mean = statistics.fmean(full) - statistics.fmean(base)
        rule_med = statistics.median(full) - statistics.median(base)
        met = "met" if rule_med <= TARGET_US and rule_mean <= TARGET_US else "NOT met"
        whole_med, whole_mean = statistics.median(full), statistics.fmean(full)
        whole_met = "met" if whole_med <= TARGET_US and whole_mean <= TARGET_US else "NOT met"
        notes.append(f"{name}: rule evaluation adds {rule_mean:.1f} us per frame on average "
                     f"({rule_med:.1f} us at the median): target <= {TARGET_US:g} us {met}; "
                     f"the whole feed (decode, store, rules) is {whole_med:.1f} us at the median and "
                     f"{whole_mean:.1f} us on average: {whole_met} as well")
    print(render(rows, markdown))
    print()
    for n in notes:
        print(n)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=[], help="scenario names (default: all)")
    ap.add_argument("--no-cost", action="store_true", help="skip the rule-cost part")
    ap.add_argument("--no-detection", action="store_true", help="skip the scenarios")
    ap.add_argument("--steps", type=int, default=800, help="recorded steps for the cost part (default 800)")
    ap.add_argument("--repeats", type=int, default=6, help="replays per pack for the cost part (default 6)")
    ap.add_argument("--markdown", action="store_true", help="print tables as markdown")
    ap.add_argument("--no-compare", action="store_true", help="skip the run under the pack before issue 20")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)  # tiny models: one thread is fastest and leaves the other core alone
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread; rule pack: built-in default",
          flush=True)
    if not args.no_detection:
        print("\n== detection: real CPU runs with injected faults ==\n")
        detection(args.only, args.markdown, not args.no_compare)
    if not args.no_cost:
        print(f"\n== rule evaluation cost: Engine.feed per frame, {GROUPS} groups ==\n")
        cost(args.steps, args.repeats, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
