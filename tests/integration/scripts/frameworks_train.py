"""Real framework training on the CPU, with references taken where each framework says
its values are final, for tests/integration/test_frameworks.py.

``python frameworks_train.py CASE OUTDIR FAULT...`` runs one case unmodified (for ``sentinel
run``: no sentinel import); the test also calls :func:`run` in its own process with
``watch=True``, where the case uses ``sentinel.watch`` or the framework's adapter, with
the engine in a thread on a free port. FAULT is ``none``, ``loss`` (NaN in the loss at
step ``FAULT_STEP``) or ``grad`` (NaN in the gradients only, at that step). Steps count
from 1, as the framework's global step after the step.

Cases: ``plain4`` (four backward calls per step), ``lbfgs`` (``step(closure)``),
``accelerate`` (``gradient_accumulation_steps=2``, clipping; ``mon.log`` per micro-batch),
``accelerate_capture`` (the same with ``watch(..., capture_loss=True)`` and no log), ``lightning``,
``lightning_accum`` (``accumulate_grad_batches=2``), ``lightning_clip``
(``gradient_clip_val``), ``lightning_accum_clip``, ``hf`` (a tiny GPT-2 from a config,
``gradient_accumulation_steps=2``, the Trainer's default clipping).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frameworks_probe import Probe, total_norm  # noqa: E402

STEPS = 5
FAULT_STEP = 4
NAN = float("nan")
WATCH = {"engine": "thread", "listen": "127.0.0.1:0"}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _batch(gen: torch.Generator, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 8, generator=gen)
    return x, x.sum(1, keepdim=True)


def _poison_grads(params: Any) -> None:
    p = next(q for q in params if q.grad is not None)
    p.grad.view(-1)[0] = NAN


def plain4(probe: Probe, watch: bool) -> None:
    """A plain loop with four backward calls per step, each loss divided by 4."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    mon = None
    if watch:
        import sentinel

        mon = sentinel.watch(model, opt, run="plain4", **WATCH)
        probe._url = lambda: mon.url
    gen = torch.Generator().manual_seed(1)
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        passed = []
        for micro in range(4):
            x, y = _batch(gen)
            loss = nn.functional.mse_loss(model(x), y)
            if probe.faulty(step, "loss") and micro == 1:
                loss = loss * NAN
            (loss / 4).backward()
            passed.append(loss.detach() / 4)
            if mon is not None:
                mon.log(loss=loss)  # each micro-batch's own loss: the step reports their mean
        if probe.faulty(step, "grad"):
            _poison_grads(model.parameters())
        probe.ref(step, grad_norm=total_norm(model.parameters()), loss=sum(passed))
        opt.step()  # the optimizer consumes the gradients here
        probe.step(step)
    if mon is not None:
        mon.close()


def lbfgs(probe: Probe, watch: bool) -> None:
    """``torch.optim.LBFGS``: forward and backward run inside ``step(closure)``, twice a step."""
    model = _mlp()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2, history_size=4)
    mon = None
    if watch:
        import sentinel

        mon = sentinel.watch(model, opt, run="lbfgs", **WATCH)
        probe._url = lambda: mon.url
    gen = torch.Generator().manual_seed(2)
    for step in range(1, STEPS + 1):
        x, y = _batch(gen, 32)
        evaluations = []

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            if probe.faulty(step, "loss"):
                loss = loss * NAN
            loss.backward()
            if probe.faulty(step, "grad") and not evaluations:
                _poison_grads(model.parameters())
            if not evaluations:  # the first evaluation: the gradient at the step's start
                probe.ref(step, grad_norm=total_norm(model.parameters()))
            evaluations.append(loss.detach())
            return loss

        loss = opt.step(closure)
        probe.ref(step, loss=loss)  # what step() returns: the first evaluation's loss
        if mon is not None:
            mon.log(loss=loss)
        probe.step(step)
    if mon is not None:
        mon.close()


def accelerate(probe: Probe, watch: bool, capture: bool = False) -> None:
    """Accelerate with ``gradient_accumulation_steps=2`` and clipping; ``watch`` after ``prepare``,
    with ``mon.log(loss=loss)`` per micro-batch or (``capture``) ``capture_loss=True`` and no log."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)  # a fresh Accelerator (the test runs several cases in one process)
    GradientState._reset_state()
    accelerator = Accelerator(gradient_accumulation_steps=2, cpu=True)
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(3)
    data = [_batch(gen) for _ in range(2 * STEPS)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    mon = None
    if watch:
        import sentinel

        if capture:  # the loss is the sum of what accelerator.backward passed on
            mon = sentinel.watch(model, opt, capture_loss=True, run="accelerate_capture", **WATCH)
        else:
            mon = sentinel.watch(model, opt, run="accelerate", **WATCH)  # opt: an AcceleratedOptimizer
        probe._url = lambda: mon.url
    step, micro_losses = 1, []
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            if probe.faulty(step, "loss") and not micro_losses:
                loss = loss * NAN
            accelerator.backward(loss)  # divides by the accumulation steps
            micro_losses.append(loss.detach())
            if mon is not None and not capture:
                mon.log(loss=loss)
            if accelerator.sync_gradients:
                if probe.faulty(step, "grad"):
                    _poison_grads(model.parameters())
                preclip = accelerator.clip_grad_norm_(model.parameters(), 0.05)
                probe.ref(step, preclip=preclip, grad_norm=total_norm(model.parameters()),
                          loss=sum(micro_losses) / len(micro_losses))
            opt.step()  # a no-op until the window's last micro-batch
            opt.zero_grad()
        if accelerator.sync_gradients:
            probe.step(step)
            step, micro_losses = step + 1, []
    if mon is not None:
        mon.close()


def lightning(probe: Probe, watch: bool, accumulate: int = 1, clip: float | None = None) -> None:
    """Lightning's Trainer, automatic optimization (``optimizer.step(closure)``)."""
    import lightning.pytorch as pl
    from lightning.pytorch.utilities import grad_norm

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()
            self.micro: list[torch.Tensor] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            if probe.faulty(self.trainer.global_step + 1, "loss") and not self.micro:
                loss = loss * NAN
            self.micro.append(loss.detach())
            self.log("train_mse", loss)
            return loss

        def on_before_optimizer_step(self, optimizer: Any) -> None:
            # Lightning: the gradients are accumulated here, and not yet clipped
            step = self.trainer.global_step + 1
            if probe.faulty(step, "grad"):
                _poison_grads(self.parameters())
            probe.ref(step, preclip=grad_norm(self, norm_type=2)["grad_2.0_norm_total"])

        def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                        gradient_clip_algorithm: Any = None) -> None:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            # after Lightning's clipping: what the optimizer applies
            probe.ref(self.trainer.global_step + 1, grad_norm=total_norm(self.parameters()))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    class Record(pl.Callback):
        def __init__(self) -> None:
            self.seen = 0

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step == self.seen:
                return
            self.seen = trainer.global_step
            # the mean of the window; train_mse as self.log last stored it (the last micro-batch)
            probe.ref(self.seen, loss=sum(module.micro) / len(module.micro), **{"scalar:train_mse": module.micro[-1]})
            module.micro.clear()
            probe.step(self.seen)

    gen = torch.Generator().manual_seed(4)
    data = [_batch(gen) for _ in range(accumulate * STEPS)]
    callbacks: list[Any] = []
    if watch:
        from sentinel.integrations.lightning import SentinelCallback

        adapter = SentinelCallback(run=f"lightning-{accumulate}-{clip}", **WATCH)
        callbacks.append(adapter)
        probe._url = lambda: adapter.monitor.url if adapter.monitor is not None else None
    callbacks.append(Record())
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, accumulate_grad_batches=accumulate,
                         gradient_clip_val=clip, callbacks=callbacks, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         default_root_dir=tempfile.mkdtemp())
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=None))


def hf(probe: Probe, watch: bool) -> None:
    """The HF Trainer on a tiny GPT-2 built from a config, ``gradient_accumulation_steps=2``."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
    gen = torch.Generator().manual_seed(5)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (2 * 2 * STEPS, 16), generator=gen)]
    state: dict[str, Any] = {}

    class Faulty(Trainer):
        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            if probe.faulty(self.state.global_step + 1, "loss"):
                loss = loss * NAN
            return loss

    def grad_hook(g: torch.Tensor) -> torch.Tensor:  # NaN in the gradients only
        return g * NAN if probe.faulty(state["trainer"].state.global_step + 1, "grad") else g

    model.transformer.h[0].mlp.c_fc.weight.register_hook(grad_hook)

    class Record(TrainerCallback):
        def on_pre_optimizer_step(self, args: Any, st: Any, control: Any, **kwargs: Any) -> None:
            # after accumulation and the Trainer's clipping: what the optimizer applies
            probe.ref(st.global_step + 1, grad_norm=total_norm(model.parameters()))

        def on_log(self, args: Any, st: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs and "grad_norm" in logs:  # logging_steps=1: every step
                probe.ref(st.global_step, loss=logs["loss"], preclip=logs["grad_norm"],
                          **{"scalar:learning_rate": logs["learning_rate"], "scalar:grad_norm": logs["grad_norm"]})
                # the fault step's grad_norm is NaN: the test compares the steps before it
                expect = ("scalar:learning_rate", "scalar:grad_norm") if logs["grad_norm"] == logs["grad_norm"] else (
                    "scalar:learning_rate",)
                probe.step(st.global_step, expect=expect if watch else ())

    callbacks: list[Any] = []
    if watch:
        from sentinel.integrations.hf import SentinelCallback

        adapter = SentinelCallback(**WATCH)
        callbacks.append(adapter)
        probe._url = lambda: adapter.monitor.url if adapter.monitor is not None else None
    callbacks.append(Record())
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), run_name="hf-tiny-gpt2", per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, max_steps=STEPS, logging_steps=1, learning_rate=1e-3,
                             lr_scheduler_type="constant", max_grad_norm=0.5, report_to="none", save_strategy="no",
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
    trainer = Faulty(model=model, args=args, train_dataset=rows, callbacks=callbacks)
    state["trainer"] = trainer
    trainer.train()


CASES: dict[str, Callable[[Probe, bool], None]] = {
    "plain4": plain4,
    "lbfgs": lbfgs,
    "accelerate": accelerate,
    "accelerate_capture": lambda p, w: accelerate(p, w, capture=True),
    "lightning": lightning,
    "lightning_accum": lambda p, w: lightning(p, w, accumulate=2),
    "lightning_clip": lambda p, w: lightning(p, w, clip=0.05),
    "lightning_accum_clip": lambda p, w: lightning(p, w, accumulate=2, clip=0.05),
    "hf": hf,
}


def run(case: str, fault: str, out: str, watch: bool = False, run: str | None = None) -> None:
    probe = Probe(out, fault, FAULT_STEP, run=run)
    try:
        CASES[case](probe, watch)
    finally:
        probe.finish()


if __name__ == "__main__":
    # argv: CASE OUTDIR FAULT...; one Python for all the faults (a framework import costs
    # seconds): each fault trains a new model and optimizer as its own run, which zero-code
    # mode names from SENTINEL_RUN when the new optimizer first steps
    torch.set_num_threads(1)
    case, outdir = sys.argv[1], sys.argv[2]
    for fault in sys.argv[3:]:
        os.environ["SENTINEL_RUN"] = f"{case}-{fault}"
        run(case, fault, os.path.join(outdir, f"{fault}.json"), run=os.environ["SENTINEL_RUN"])
