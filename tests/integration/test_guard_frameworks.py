"""The step guard in the frameworks' own loops, for real on the CPU: Lightning's Trainer
(automatic optimization: the step runs the closure) with the adapter, whose skip list
survives a checkpoint; the HF Trainer with its adapter (``guard=True`` passes through)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.integration
pl = pytest.importorskip("lightning.pytorch", reason="the frameworks extra: pip install -e '.[frameworks]'")
BAD = 5  # the batch_idx whose inputs hold a NaN, in epoch 0


class Module(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.current_epoch == 0 and batch_idx == BAD:
            x = x.clone()
            x[0, 0] = float("nan")
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=3)}


def _data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def test_lightning_guard_skips_the_bad_batch_and_its_checkpoint_keeps_the_skip_list(tmp_path: Path) -> None:
    from sentinel.integrations.lightning import SentinelCallback

    torch.manual_seed(0)
    module = Module()
    cb = SentinelCallback(run="g-lightning", engine="off", guard=True)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[cb])
    trainer.fit(module, _data())
    assert all(torch.isfinite(p).all() for p in module.parameters())
    assert cb.skips == [{"step": BAD + 1, "epoch": 0, "batch": BAD, "reason": "nonfinite"}]
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    # a restart from the checkpoint: the callback gets the skip list back
    cb2 = SentinelCallback(run="g-lightning-2", engine="off", guard=True)
    trainer2 = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, callbacks=[cb2])
    trainer2.fit(Module(), _data(), ckpt_path=str(path))
    assert cb2.skipped(0, BAD) and not cb2.skipped(1, BAD)
    assert cb2.skips[0] == {"step": BAD + 1, "epoch": 0, "batch": BAD, "reason": "nonfinite"}


def test_hf_trainer_guard_keeps_a_nan_step_out(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import Trainer, TrainingArguments

    from sentinel.integrations.hf import SentinelCallback

    class Regressor(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}

    g = torch.Generator().manual_seed(0)
    rows = [{"x": torch.randn(8, generator=g)} for _ in range(64)]
    for r in rows:
        r["labels"] = r["x"].sum().reshape(1)
    rows[20]["x"] = rows[20]["x"].clone().fill_(float("nan"))  # one sample (the Trainer shuffles: some step)
    torch.manual_seed(0)
    model = Regressor()
    cb = SentinelCallback(run="g-hf", engine="off", guard=True)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=8, report_to=[],
                             logging_steps=100, save_strategy="no", use_cpu=True, max_grad_norm=1.0,
                             dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=[cb])
    mon_box: list[Any] = []
    orig = cb.on_train_begin

    def keep(*a: Any, **kw: Any) -> None:
        orig(*a, **kw)
        mon_box.append(cb.monitor)
    cb.on_train_begin = keep  # type: ignore[method-assign]
    trainer.train()
    mon = mon_box[0]
    assert len(mon.guard.steps) == 1 and mon.guard.skipped == {"nonfinite": 1, "spike": 0}
    assert all(torch.isfinite(p).all() for p in model.parameters())
