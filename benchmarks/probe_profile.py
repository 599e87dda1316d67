"""Where the host time of Sentinel's hooks goes, per watched step: the Python (cProfile,
Sentinel's functions by their own time) and the torch operators they call (torch.profiler,
self CPU time per operator, with the number of calls a step).

On CUDA the kernels run asynchronously, so what a step's hooks cost the training process is
this host time: on the H200 (docs/performance.md, "On a GPU") it grew with the number of
parameter tensors, 1.2 ms a step at 77 and 3.2 ms at 293, and on a small model the GPU
waited for it. This prints what to cut. It asserts nothing.

Usage::

    python benchmarks/probe_profile.py                                   # CPU, the small model
    python benchmarks/probe_profile.py --device cuda --model gpt2-medium --bf16
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import sys
from collections.abc import Callable, Sequence

import torch

import sentinel
from sentinel.demo.model import TinyGPT, loss_fn, synthetic_batch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from overhead import MODELS  # noqa: E402  (a sibling script)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", choices=sorted(MODELS), default="small")
    ap.add_argument("--bf16", action="store_true", help="a bf16 autocast forward")
    ap.add_argument("--tokens", type=int, default=None, help="tokens a step (default: 2 sequences)")
    ap.add_argument("--steps", type=int, default=30, help="profiled steps (after 120 unprofiled ones)")
    ap.add_argument("--top", type=int, default=25, help="rows of each table")
    args = ap.parse_args(argv)
    device = torch.device(args.device if args.device != "cuda" or torch.cuda.is_available() else "cpu")
    vocab, dim, depth, heads, seq = MODELS[args.model]
    torch.manual_seed(0)
    model = TinyGPT(vocab, dim, depth, heads, seq).to(device)
    base = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    base_opt = torch.optim.AdamW(base.parameters(), lr=3e-4)
    gen = torch.Generator().manual_seed(0)
    batch = max(1, (args.tokens or 2 * seq) // seq)
    batches = [synthetic_batch(gen, batch, seq, vocab, device) for _ in range(4)]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    mon = sentinel.watch(model, opt, listen="127.0.0.1:0")
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    print(f"{args.model} on {device}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters in "
          f"{tensors} tensors; torch {torch.__version__}; {args.steps} profiled steps after 120", flush=True)

    def step(i: int, watched: bool = True) -> None:
        m, o = (model, opt) if watched else (base, base_opt)
        x, y = batches[i % len(batches)]
        o.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn(m(x), y)
        loss.backward()
        o.step()
        if watched:
            mon.log(loss=loss)

    def ops(watched: bool) -> dict[str, tuple[float, float]]:
        """Per operator: (calls a step, self CPU µs a step) over the profiled steps."""
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities) as tp:
            for i in range(args.steps):
                step(i, watched)
            sync()
        return {e.key: (e.count / args.steps, e.self_cpu_time_total / args.steps) for e in tp.key_averages()}

    try:
        for i in range(120):  # past the first 50 steps' every-step update samples
            step(i)
            step(i, watched=False)
        sync()
        p0 = mon.probe_seconds
        prof = cProfile.Profile()
        prof.enable()
        for i in range(args.steps):
            step(i)
        prof.disable()
        sync()
        host = (mon.probe_seconds - p0) / args.steps
        plain, watched = ops(False), ops(True)
    finally:
        mon.close()
    print(f"\nhost time in Sentinel's hooks (probe_seconds, under cProfile): {1e3 * host:.3f} ms a step\n")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats("sentinel/(instrument|wire)", args.top)
    print(out.getvalue())
    rows = []
    for key in set(plain) | set(watched):
        n1, t1 = watched.get(key, (0.0, 0.0))
        n0, t0 = plain.get(key, (0.0, 0.0))
        if n1 - n0 > 0.05:  # an operator Sentinel calls (same counts: the model's, timing noise)
            rows.append((t1 - t0, n1 - n0, key))
    rows.sort(reverse=True)
    print("torch operators a watched step calls beyond an unwatched one's (torch.profiler; the self CPU\n"
          "time is the difference of the two runs' totals, so an operator both call carries noise):\n")
    print(f"{'self CPU us/step':>17} {'calls/step':>11}  operator")
    for dt, dn, key in rows[:args.top]:
        print(f"{dt:17.1f} {dn:11.1f}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
