"""Overhead of ``sentinel.watch`` on a GPT-like model trained with AdamW (~6M parameters; GPT-2 sizes with ``--model``).

Two identical copies of the model and optimizer train side by side in one process: one
watched by sentinel with its defaults (the engine in a child process serving metrics on a
free loopback port, so its CPU use on shared cores is part of the cost), one not. Blocks of steps alternate between
them (ABBA order across repeats, so drift and thermal effects cancel), at 512 and 2048
tokens per step. A third kind of block, on the unwatched copy, times the floor: one fused
read of all gradients (``torch._foreach_norm``), and the naive per-parameter ``.item()``
loop that Composer and Lightning use, both between ``backward()`` and ``step()``.

Everything reported is a median over steps, pooled over repeats; the per-repeat spread of
the overhead is printed too, because 1% is within the noise of a shared machine. Nothing
here asserts on timings: it prints a table and exits 0.

Usage::

    python benchmarks/overhead.py               # full run, CPU
    python benchmarks/overhead.py --quick       # a smoke run
    python benchmarks/overhead.py --device cuda --markdown
    python benchmarks/overhead.py --device cuda --model gpt2-medium --bf16   # a realistic GPU run
"""

from __future__ import annotations

import argparse
import copy
import gc
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

import sentinel
from sentinel.demo.model import TinyGPT, loss_fn, synthetic_batch

# (vocab, dim, depth, heads, seq). small: ~6M parameters, 6 blocks of width 256 (~4.7M) plus
# a 2048-token embedding and head, sized for a CPU. gpt2 and gpt2-medium: GPT-2's shapes
# (vocab padded to 50304, context 1024; 163M and 406M parameters here, the head untied), the
# sizes of a real GPU run.
MODELS = {"small": (2048, 256, 6, 4, 256), "gpt2": (50304, 768, 12, 12, 1024),
          "gpt2-medium": (50304, 1024, 24, 16, 1024)}
VOCAB, DIM, DEPTH, HEADS, SEQ = MODELS["small"]
TOKENS = (512, 2048)  # tokens per step = batch x SEQ
TARGET_RATIO = 1.5  # in-hook probe time <= 1.5x the fused-read floor
TARGET_OVERHEAD = 1.0  # percent, at 2048 tokens/step
TARGET_TOKENS = 2048


@dataclass
class Samples:
    """Per-step timings (seconds) of one tokens/step configuration, pooled over repeats."""

    base: list[float] = field(default_factory=list)
    mon: list[float] = field(default_factory=list)
    probe: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    naive: list[float] = field(default_factory=list)
    overhead_by_repeat: list[float] = field(default_factory=list)


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class Bench:
    """The two model copies, their optimizers, the monitor and a pool of batches."""

    def __init__(self, device: torch.device, seed: int = 0, model: str = "small", bf16: bool = False) -> None:
        self.device = device
        self.sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.vocab, dim, depth, heads, self.seq = MODELS[model]
        # a bf16 autocast forward, as mixed-precision training runs it (parameters, gradients
        # and optimizer state stay float32)
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
        torch.manual_seed(seed)
        self.base_model = TinyGPT(self.vocab, dim, depth, heads, self.seq).to(device)
        self.mon_model = copy.deepcopy(self.base_model)
        self.base_opt = torch.optim.AdamW(self.base_model.parameters(), lr=3e-4)
        self.mon_opt = torch.optim.AdamW(self.mon_model.parameters(), lr=3e-4)
        self.mon = sentinel.watch(self.mon_model, self.mon_opt, listen="127.0.0.1:0")
        self.params = [p for p in self.base_model.parameters() if p.requires_grad]
        self.gen = torch.Generator().manual_seed(seed)
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._i = 0

    def set_tokens(self, tokens: int, pool: int = 8) -> None:
        """Pre-build a small pool of batches so data generation stays out of the timings."""
        batch = tokens // self.seq
        self.batches = [synthetic_batch(self.gen, batch, self.seq, self.vocab, self.device) for _ in range(pool)]
        self._i = 0

    def _next(self) -> tuple[torch.Tensor, torch.Tensor]:
        self._i = (self._i + 1) % len(self.batches)
        return self.batches[self._i]

    def base_step(self) -> float:
        x, y = self._next()
        self.sync()
        t0 = time.perf_counter()
        self.base_opt.zero_grad(set_to_none=True)
        with self.autocast:
            loss = loss_fn(self.base_model(x), y)
        loss.backward()
        self.base_opt.step()
        self.sync()
        return time.perf_counter() - t0

    def mon_step(self) -> tuple[float, float]:
        """One watched step; returns (step seconds, seconds spent inside sentinel)."""
        x, y = self._next()
        p0 = self.mon.probe_seconds
        self.sync()
        t0 = time.perf_counter()
        self.mon_opt.zero_grad(set_to_none=True)
        with self.autocast:
            loss = loss_fn(self.mon_model(x), y)
        loss.backward()
        self.mon_opt.step()
        self.mon.log(loss=loss)
        self.sync()
        return time.perf_counter() - t0, self.mon.probe_seconds - p0

    def read_step(self, naive: bool) -> float:
        """An unwatched step that times one gradient read between backward and step.

        The grad list is built before the clock starts: the floor is the fused kernel alone.
        """
        x, y = self._next()
        self.base_opt.zero_grad(set_to_none=True)
        with self.autocast:
            loss = loss_fn(self.base_model(x), y)
        loss.backward()
        grads = [p.grad for p in self.params if p.grad is not None]
        self.sync()
        t0 = time.perf_counter()
        if naive:
            _ = [p.grad.norm().item() for p in self.params if p.grad is not None]
        else:
            _ = torch._foreach_norm(grads, 2)
        self.sync()
        dt = time.perf_counter() - t0
        self.base_opt.step()
        return dt

    def settle(self) -> None:
        """Between blocks, untimed: let the engine ingest what was sent, collect garbage."""
        flush = getattr(self.mon.engine, "flush", None)
        if flush is not None:
            flush()
        gc.collect()

    def close(self) -> None:
        self.mon.close()


def run_config(b: Bench, tokens: int, steps: int, repeats: int, warmup: int) -> Samples:
    b.set_tokens(tokens)
    update_every, early = b.mon.options.update_every, b.mon.options.early_steps
    for _ in range(warmup):
        b.base_step()
    # at least one update-ratio sample, so the snapshot buffers exist before timing, and
    # past the first early_steps, which sample the update ratio at every step (a one-off
    # cost of the run's first steps, not the steady state timed here)
    for _ in range(max(warmup, update_every, early - b.mon.steps)):
        b.mon_step()
    for k in range(warmup):
        b.read_step(naive=bool(k % 2))
    b.settle()
    s = Samples()
    for r in range(repeats):
        base: list[float] = []
        mon: list[float] = []
        order = ("base", "mon") if r % 2 == 0 else ("mon", "base")
        for kind in order:
            if kind == "base":
                base = [b.base_step() for _ in range(steps)]
            else:
                for _ in range(steps):
                    dt, probe = b.mon_step()
                    mon.append(dt)
                    s.probe.append(probe)
            b.settle()
        for k in range(steps):  # floor and naive alternate step by step
            (s.naive if (k + r) % 2 else s.floor).append(b.read_step(naive=bool((k + r) % 2)))
        b.settle()
        s.base += base
        s.mon += mon
        s.overhead_by_repeat.append(100.0 * (_med(mon) / _med(base) - 1.0))
    return s


def _ms(x: float) -> str:
    return f"{1e3 * x:.3f}"


def render(rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---:" for _ in rows[0]) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=25, help="steps per block (default 25: 8 repeats time 200 watched steps, 4 update samples)")
    ap.add_argument("--repeats", type=int, default=8, help="alternations of the blocks (default 8)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps per model and config (default 10)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: --steps 10 --repeats 2 --warmup 3")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda; cuda falls back to cpu if absent")
    ap.add_argument("--model", choices=sorted(MODELS), default="small",
                    help="small (default, 5.85M parameters), gpt2 (GPT-2's shape, 163M with its untied head) or "
                         "gpt2-medium (406M)")
    ap.add_argument("--bf16", action="store_true", help="a bf16 autocast forward (mixed precision)")
    ap.add_argument("--tokens", type=int, nargs="+", default=None,
                    help="tokens per step, multiples of the model's seq (default 512 2048 for small; "
                         "8192 16384 for the GPT-2 sizes)")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.warmup = 10, 2, 3
    if args.tokens is None:
        args.tokens = list(TOKENS) if args.model == "small" else [8192, 16384]

    logging.basicConfig(level=logging.WARNING)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("cuda requested but not available; running on cpu", file=sys.stderr)
        device = torch.device("cpu")
    # All the cores this process may run on: training gets them all, as it would in
    # production; sentinel's ingest thread and HTTP server must share them.
    cores = _available_cores()
    torch.set_num_threads(cores)

    b = Bench(device, model=args.model, bf16=args.bf16)
    n_params = sum(p.numel() for p in b.base_model.parameters())
    n_tensors = len(b.params)
    vocab, dim, depth, heads, seq = MODELS[args.model]
    print(f"model: {args.model}: TinyGPT(vocab={vocab}, dim={dim}, depth={depth}, heads={heads}, seq={seq}): "
          f"{n_params / 1e6:.2f}M parameters in {n_tensors} tensors, AdamW"
          + ("; bf16 autocast forward" if args.bf16 else ""))
    if device.type == "cuda":
        print(f"gpu: {torch.cuda.get_device_name()}")
    print(f"device: {device}; torch {torch.__version__}; torch threads: {torch.get_num_threads()} "
          f"(= cores available to this process)")
    print(f"sentinel: engine={b.mon.options.engine} at {b.mon.url}; groups={len(b.mon.groups)}; "
          f"update_every={b.mon.options.update_every}; health_every={b.mon.options.health_every}")
    print(f"blocks: {args.steps} steps x {args.repeats} repeats per config, warmup {args.warmup}; "
          f"medians over steps pooled across repeats", flush=True)

    results: dict[int, Samples] = {}
    try:
        for tokens in args.tokens:
            if tokens % b.seq:
                print(f"skipping {tokens} tokens/step: not a multiple of seq={b.seq}", file=sys.stderr)
                continue
            t0 = time.perf_counter()
            results[tokens] = run_config(b, tokens, args.steps, args.repeats, args.warmup)
            print(f"  {tokens} tokens/step done in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        snap_bytes = sum(s.buffer_bytes for s in b.mon.layout.snapshots)
        param_bytes = b.mon.param_bytes
        errors, dropped = b.mon.errors, b.mon.frames_dropped
    finally:
        b.close()

    head = ["tokens/step", "baseline ms", "sentinel ms", f"overhead % (target <={TARGET_OVERHEAD:g}% @{TARGET_TOKENS})",
            "probe ms/step", "floor ms", f"probe/floor (target <={TARGET_RATIO:g}x)", "naive .item() ms", "naive/floor"]
    rows = [head]
    for tokens, s in results.items():
        base, mon, probe, floor, naive = (_med(x) for x in (s.base, s.mon, s.probe, s.floor, s.naive))
        rows.append([str(tokens), _ms(base), _ms(mon), f"{100 * (mon / base - 1):+.2f}", _ms(probe),
                     _ms(floor), f"{probe / floor:.2f}x", _ms(naive), f"{naive / floor:.2f}x"])
    print()
    print(render(rows, args.markdown))
    print()
    for tokens, s in results.items():
        ob = sorted(s.overhead_by_repeat)
        probe_mean = statistics.fmean(s.probe)
        print(f"{tokens} tokens/step: overhead per repeat {ob[0]:+.2f}% .. {ob[-1]:+.2f}% "
              f"(median {_med(ob):+.2f}%); mean step baseline {_ms(statistics.fmean(s.base))} ms, "
              f"sentinel {_ms(statistics.fmean(s.mon))} ms; mean probe {_ms(probe_mean)} ms/step "
              f"(includes the every-{b.mon.options.update_every}-step samplers), max {_ms(max(s.probe))} ms")
    if TARGET_TOKENS in results:
        s = results[TARGET_TOKENS]
        ov = 100 * (_med(s.mon) / _med(s.base) - 1)
        ratio = _med(s.probe) / _med(s.floor)
        print(f"targets @{TARGET_TOKENS} tokens/step: overhead {ov:+.2f}% "
              f"({'met' if ov <= TARGET_OVERHEAD else 'NOT met'}, target <={TARGET_OVERHEAD:g}%); "
              f"probe/floor {ratio:.2f}x ({'met' if ratio <= TARGET_RATIO else 'NOT met'}, "
              f"target <={TARGET_RATIO:g}x)")
    print(f"memory: update-ratio snapshot buffers {snap_bytes / 2**20:.1f} MiB "
          f"beside {param_bytes / 2**20:.1f} MiB of parameters "
          f"({100 * snap_bytes / param_bytes:.0f}%; bound update_snapshot_bytes="
          f"{b.mon.options.update_snapshot_bytes / 2**20:.0f} MiB)")
    print(f"sentinel: {errors} probe errors, {dropped} frames dropped")
    if device.type == "cuda":
        print("note: on cuda the probe column is host time in the hooks (kernels run async), "
              "while the floor and naive columns are synchronised wall time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
