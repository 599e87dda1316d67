"""Sentinel against what a user would run instead, on the reference model of ``overhead.py``.

One process trains five identical copies of the ~6M-parameter GPT-like model (AdamW, 2048
tokens per step by default, torch threads = the cores available), each with its own
optimizer:

- ``baseline``: nothing watches it;
- ``sentinel``: ``sentinel.watch`` with its defaults, the engine in its child process serving
  metrics on a free loopback port (as ``overhead.py`` does), ``mon.log(loss=loss)`` each step;
- ``lightning grad_norm``: ``lightning.pytorch.utilities.grad_norm(model, norm_type=2)``
  between ``backward()`` and ``step()`` (where Lightning's ``on_before_optimizer_step`` runs
  it), every value ``.item()``-ed as a logger does;
- ``wandb.watch``: ``wandb.watch(model, log="all", log_freq=1)`` with ``WANDB_MODE=offline``
  in a temporary ``WANDB_DIR`` (nothing leaves the machine), ``run.log({"loss": ...})`` each
  step to commit it; its system-metrics sampler is off, so it does not load the shared
  cores during the other copies' blocks;
- ``fused norm``: a hand-written single fused norm, ``torch._foreach_norm`` + ``stack`` +
  ``norm`` + one ``.item()``, between ``backward()`` and ``step()``.

Blocks of steps interleave: before each monitor's block comes a baseline block (B S B L B W
B F, the monitors' order rotating each repeat), so drift and other tenants' load fall on the
baseline and the monitors alike. The ratio is the monitor's median step time over the median
of every baseline step of the run. Step time on shared cores swings between repeats, so the
table also gives the time spent inside each monitor's own code per step: for sentinel its
``Monitor.probe_seconds``; for the others the calls timed here (for wandb, its tensor-stats
hooks and ``run.log``). The mean includes sentinel's periodic samplers (every
``update_every`` steps: weight snapshot, update ratio, parameter norms; every
``health_every``: gradient SNR); the timed sentinel steps (blocks × repeats) are a multiple
of ``update_every`` so each sampler runs in proportion.

The peers come from the ``bench`` extra (``pip install -e '.[bench]'``); a peer that is not
installed is skipped with a note. Nothing here asserts on timings: it prints a table and
exits 0.

Usage::

    python benchmarks/peers.py               # full run, CPU
    python benchmarks/peers.py --quick       # a smoke run
    python benchmarks/peers.py --markdown
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from overhead import SEQ, Bench, _available_cores, _med, _ms, render

from sentinel.demo.model import loss_fn


@dataclass
class Peer:
    """One row: a monitor's step function and its timings, pooled over repeats."""

    name: str
    step: Callable[[], tuple[float, float]]
    close: Callable[[], None] = lambda: None
    steps: list[float] = field(default_factory=list)
    inside: list[float] = field(default_factory=list)
    blocks: list[float] = field(default_factory=list)  # per block: its median step time over the baseline block before it


class _Copy:
    """A further copy of the bench's unwatched model, with its own AdamW."""

    def __init__(self, b: Bench) -> None:
        self.b = b
        self.model = copy.deepcopy(b.base_model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def _forward_backward(self) -> torch.Tensor:
        x, y = self.b._next()
        self.opt.zero_grad(set_to_none=True)
        loss = loss_fn(self.model(x), y)
        loss.backward()
        return loss


def _between_backward_and_step(c: _Copy, read: Callable[[], Any]) -> Callable[[], tuple[float, float]]:
    """A step that runs ``read`` where a framework's before-optimizer-step callback runs."""
    def step() -> tuple[float, float]:
        c.b.sync()
        t0 = time.perf_counter()
        c._forward_backward()
        t1 = time.perf_counter()
        read()
        t2 = time.perf_counter()
        c.opt.step()
        c.b.sync()
        return time.perf_counter() - t0, t2 - t1
    return step


def fused_peer(b: Bench) -> Peer:
    c = _Copy(b)

    def read() -> float:
        grads = [p.grad for p in c.params if p.grad is not None]
        total = torch.stack(list(torch._foreach_norm(grads, 2))).norm(2)
        return float(total.item())
    return Peer("fused norm (1 .item())", _between_backward_and_step(c, read))


def lightning_peer(b: Bench) -> Peer | str:
    try:
        from lightning.pytorch.utilities import grad_norm
    except ImportError:
        return "lightning grad_norm: skipped (lightning not installed; pip install -e '.[bench]')"
    c = _Copy(b)

    def read() -> dict[str, float]:
        # typed dict[str, float], but the values are 0-d tensors: a logger .item()s each
        return {k: v.item() if isinstance(v, torch.Tensor) else float(v)
                for k, v in grad_norm(c.model, norm_type=2).items()}
    return Peer("lightning grad_norm", _between_backward_and_step(c, read))


def wandb_peer(b: Bench, wandb_dir: str) -> Peer | str:
    os.environ.update(WANDB_MODE="offline", WANDB_DIR=wandb_dir, WANDB_SILENT="true",
                      WANDB_DISABLE_GIT="true", WANDB_DISABLE_CODE="true")
    try:
        import wandb
    except ImportError:
        return "wandb.watch: skipped (wandb not installed; pip install -e '.[bench]')"
    c = _Copy(b)
    run = wandb.init(project="sentinel-peers", dir=wandb_dir, mode="offline",
                     settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_machine_info=True,
                                             save_code=False, disable_git=True, silent=True))
    run.watch(c.model, log="all", log_freq=1)
    inside = [0.0]
    hist = run._torch  # the TorchHistory whose hooks wandb.watch registered
    stats = hist.log_tensor_stats

    def timed_stats(tensor: Any, name: str) -> None:
        t0 = time.perf_counter()
        try:
            stats(tensor, name)
        finally:
            inside[0] += time.perf_counter() - t0
    hist.log_tensor_stats = timed_stats  # the hooks look it up on the instance

    def step() -> tuple[float, float]:
        inside[0] = 0.0
        c.b.sync()
        t0 = time.perf_counter()
        loss = c._forward_backward()
        c.opt.step()
        t1 = time.perf_counter()
        run.log({"loss": loss.item()})
        t2 = time.perf_counter()
        c.b.sync()
        return time.perf_counter() - t0, inside[0] + (t2 - t1)

    def close() -> None:
        run.finish()
    return Peer("wandb.watch(log=all, log_freq=1)", step, close)


def sentinel_peer(b: Bench) -> Peer:
    return Peer("sentinel (defaults)", b.mon_step)


def run(b: Bench, peers: list[Peer], steps: int, repeats: int, warmup: int) -> Peer:
    """Interleave baseline and monitor blocks; returns the baseline's row."""
    base = Peer("baseline (unwatched)", lambda: (b.base_step(), 0.0))
    for p in (base, *peers):
        for _ in range(warmup):
            p.step()
    # the snapshot buffers exist before timing, and the run is past the first early_steps,
    # which sample the update ratio at every step (a one-off, not the steady cost)
    o = b.mon.options
    for _ in range(max(warmup, o.update_every, getattr(o, "early_steps", 0) - b.mon.steps)):
        b.mon_step()
    b.settle()
    t0 = time.perf_counter()
    for r in range(repeats):
        order = peers[r % len(peers):] + peers[:r % len(peers)]
        for p in order:
            meds = []
            for q in (base, p):
                block = [q.step() for _ in range(steps)]
                q.steps += [t for t, _ in block]
                q.inside += [i for _, i in block]
                meds.append(_med([t for t, _ in block]))
                b.settle()
            base.blocks.append(meds[0])
            p.blocks.append(meds[1] / meds[0])
        print(f"  repeat {r + 1}/{repeats} done ({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    return base


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=25, help="steps per block (default 25)")
    ap.add_argument("--repeats", type=int, default=4, help="rounds over the monitors (default 4)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per copy (default 5)")
    ap.add_argument("--tokens", type=int, default=2048, help=f"tokens per step, a multiple of {SEQ} (default 2048)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: --steps 10 --repeats 1 --warmup 2")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.warmup = 10, 1, 2
    if args.tokens % SEQ:
        ap.error(f"--tokens: must be a multiple of seq={SEQ}")

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(_available_cores())
    b = Bench(torch.device("cpu"))
    b.set_tokens(args.tokens)
    every = b.mon.options.update_every
    if (args.steps * args.repeats) % every:
        print(f"note: {args.steps * args.repeats} timed steps are not a multiple of update_every={every}: "
              "the mean over-/under-counts sentinel's periodic samplers", file=sys.stderr)
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sentinel-peers-wandb-") as wandb_dir:
        peers: list[Peer] = [sentinel_peer(b)]
        for made in (lightning_peer(b), wandb_peer(b, wandb_dir), fused_peer(b)):
            if isinstance(made, str):
                notes.append(made)
            else:
                peers.append(made)
        n_params = sum(p.numel() for p in b.base_model.parameters())
        print(f"model: {n_params / 1e6:.2f}M parameters in {len(b.params)} tensors, AdamW; "
              f"{args.tokens} tokens/step; torch {torch.__version__}, {torch.get_num_threads()} threads")
        print(f"sentinel: engine={b.mon.options.engine}; groups={len(b.mon.groups)}; "
              f"update_every={every}; health_every={b.mon.options.health_every}")
        print(f"blocks: {args.steps} steps, baseline block before each monitor block, "
              f"{args.repeats} repeats, warmup {args.warmup}", flush=True)
        try:
            base = run(b, peers, args.steps, args.repeats, args.warmup)
        finally:
            for p in peers:
                p.close()
            errors, dropped = b.mon.errors, b.mon.frames_dropped
            b.close()

    base_med = _med(base.steps)
    head = ["monitor", "step ms median", "step ms mean", "ratio to baseline (medians)",
            "in-code ms median", "in-code ms mean", "in-code ms max"]
    rows = [head, [base.name, _ms(base_med), _ms(statistics.fmean(base.steps)), "1.000", "-", "-", "-"]]
    for p in peers:
        rows.append([p.name, _ms(_med(p.steps)), _ms(statistics.fmean(p.steps)), f"{_med(p.steps) / base_med:.3f}",
                     _ms(_med(p.inside)), _ms(statistics.fmean(p.inside)), _ms(max(p.inside))])
    print()
    print(render(rows, args.markdown))
    print()
    spread = sorted(base.blocks)
    print(f"baseline block medians {_ms(spread[0])} .. {_ms(spread[-1])} ms "
          f"({100 * (spread[-1] / spread[0] - 1):.0f}% apart): the ratios carry that noise, the in-code times less so")
    for p in peers:
        per = sorted(p.blocks)
        print(f"{p.name}: ratio to the baseline block before it {per[0]:.3f} .. {per[-1]:.3f} "
              f"(median {_med(per):.3f})")
    for note in notes:
        print(note)
    print(f"sentinel: {errors} probe errors, {dropped} frames dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
