"""What the step guard costs per step, on the reference model of ``overhead.py``.

One process trains identical copies of the ~6M-parameter GPT-like model (2048 tokens per
step by default, torch threads = the cores available), each with its own AdamW:

- for-each AdamW: ``none`` (nothing watches it), ``monitor`` (``sentinel.watch``, guard
  off), ``guard sync`` (``guard=True``: on the CPU the ``sync`` method, whose read of the
  flag is free there and which copies nothing on an applied step), ``guard select``
  (``guard={"method": "select"}``: the device-side snapshot and select an accelerator takes
  for a non-fused optimizer, here on the CPU);
- fused AdamW (``fused=True``): ``none``, ``monitor``, ``guard fused`` (the ``found_inf``
  path).

Every monitor runs with ``engine="off"`` (frames are built and dropped): what differs
between ``monitor`` and ``guard`` is the guard alone. Blocks of steps interleave, each
monitored copy's block preceded by a block of its optimizer's ``none`` copy, the order
rotating each repeat, so drift and other tenants' load fall on all alike. The table gives
the median and mean step time, the ratio of the median to its ``none``, the guard's extra
over ``monitor`` (median and mean), and the guard's extra memory (the select snapshot's
buffers; the fused and sync paths hold none on applied steps). Nothing here asserts on
timings: it prints a table and exits 0.

Usage::

    python benchmarks/guard.py               # full run, CPU
    python benchmarks/guard.py --quick       # a smoke run
    python benchmarks/guard.py --device cuda --markdown
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from overhead import DEPTH, DIM, HEADS, SEQ, VOCAB, _available_cores, _med, _ms, render

import sentinel
from sentinel.demo.model import TinyGPT, loss_fn, synthetic_batch


@dataclass
class Copy:
    name: str
    fused: bool
    guard: Any  # None: no guard; "off": no monitor at all
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    mon: Any = None
    times: list[float] = field(default_factory=list)


def _make(base: torch.nn.Module, name: str, fused: bool, guard: Any) -> Copy:
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, **({"fused": True} if fused else {"foreach": True}))
    c = Copy(name, fused, guard, model, opt)
    if guard != "off":
        c.mon = sentinel.watch(model, opt, engine="off", guard=guard, run=f"bench-{name.replace(' ', '-')}")
    return c


def _extra_bytes(c: Copy) -> int:
    g = getattr(c.mon, "guard", None)
    if g is None:
        return 0
    return sum(st.select.nbytes for st in g._opts.values() if st.select is not None)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="steps per block (default 20)")
    ap.add_argument("--repeats", type=int, default=6, help="alternations of the blocks (default 6)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per copy (default 5)")
    ap.add_argument("--tokens", type=int, default=2048, help=f"tokens per step, a multiple of {SEQ} (default 2048)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: --steps 4 --repeats 2 --warmup 2")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.warmup = 4, 2, 2
    logging.basicConfig(level=logging.WARNING)
    device = torch.device(args.device if args.device != "cuda" or torch.cuda.is_available() else "cpu")
    torch.set_num_threads(_available_cores())
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    base = TinyGPT(VOCAB, DIM, DEPTH, HEADS, SEQ).to(device)
    copies = [_make(base, "none", False, "off"), _make(base, "monitor", False, None),
              _make(base, "guard sync", False, True), _make(base, "guard select", False, {"method": "select"}),
              _make(base, "none (fused)", True, "off"), _make(base, "monitor (fused)", True, None),
              _make(base, "guard fused", True, True)]
    gen = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(gen, args.tokens // SEQ, SEQ, VOCAB, device) for _ in range(8)]
    i = 0

    def step(c: Copy) -> float:
        nonlocal i
        x, y = batches[i % len(batches)]
        i += 1
        sync()
        t0 = time.perf_counter()
        c.opt.zero_grad(set_to_none=True)
        loss = loss_fn(c.model(x), y)
        loss.backward()
        c.opt.step()
        if c.mon is not None:
            c.mon.log(loss=loss)
        sync()
        return time.perf_counter() - t0

    for c in copies:
        for _ in range(args.warmup):
            step(c)
    watched = [c for c in copies if c.guard != "off"]
    for r in range(args.repeats):
        order = watched[r % len(watched):] + watched[:r % len(watched)]
        for c in order:
            base_copy = copies[4] if c.fused else copies[0]
            base_copy.times += [step(base_copy) for _ in range(args.steps)]
            c.times += [step(c) for _ in range(args.steps)]
    mem = {c.name: _extra_bytes(c) for c in copies}
    for c in copies:
        if c.mon is not None:
            assert not getattr(c.mon.guard, "steps", []), "a clean run: the guard must skip nothing"
            c.mon.close()
    n = sum(p.numel() for p in base.parameters())
    print(f"model: TinyGPT ~{n / 1e6:.1f}M parameters, {args.tokens} tokens/step, {device}, "
          f"{torch.get_num_threads()} threads; {args.repeats} x {args.steps} timed steps per copy")
    rows = [["copy", "median ms", "mean ms", "x none (median)", "guard extra median ms", "guard extra mean ms",
             "extra memory"]]
    by = {c.name: c for c in copies}
    for c in copies:
        none = by["none (fused)" if c.fused else "none"]
        mon = by["monitor (fused)" if c.fused else "monitor"]
        med, mean = _med(c.times), statistics.fmean(c.times)
        guarded = c.guard not in ("off", None)
        rows.append([c.name, _ms(med), _ms(mean), f"{med / _med(none.times):.3f}",
                     _ms(med - _med(mon.times)) if guarded else "—",
                     _ms(mean - statistics.fmean(mon.times)) if guarded else "—",
                     f"{mem[c.name] / 2**20:.1f} MiB" if guarded else "—"])
    print(render(rows, args.markdown))
    print(f"parameters {sum(p.numel() * p.element_size() for p in base.parameters()) / 2**20:.1f} MiB; "
          f"AdamW state 2x that plus step counters", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
