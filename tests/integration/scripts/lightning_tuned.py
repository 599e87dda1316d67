"""Lightning's tuner, then the fit, in the shape of Lightning's tuner docs: a LightningModule
with ``batch_size`` and ``lr`` attributes its ``train_dataloader`` and
``configure_optimizers`` read, ``Tuner(trainer).scale_batch_size(model, mode="power")`` (or
``Tuner(trainer).lr_find(model)``), then ``trainer.fit(model)``. No sentinel import.

The batch-size finder trains ``steps_per_trial`` steps at each batch size with the model's
one Adam, the learning-rate finder up to 100 steps at a rising lr; each then restores the
weights it began with (``load_state_dict``) for the fit: the fit's first losses come after
the tuner's, in the same optimizer's count.

Prints what the tuner found, every fit step's loss with repr and the fit's step count.

argv: [batch-size|lr] [MAX_EPOCHS]
"""

import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.tuner import Tuner
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LitRegressor(L.LightningModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.lr = 1e-3
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4096, 16, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size)


class PrintLoss(Callback):
    def __init__(self) -> None:
        self.fitting = False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: dict, batch: object,
                           batch_idx: int) -> None:
        if self.fitting:
            print(f"loss {trainer.global_step} {outputs['loss'].item()!r}")


torch.manual_seed(0)
model = LitRegressor()
printer = PrintLoss()
mode = sys.argv[1] if len(sys.argv) > 1 else "batch-size"
trainer = L.Trainer(max_epochs=int(sys.argv[2]) if len(sys.argv) > 2 else 3, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[printer])
if mode == "lr":
    found = Tuner(trainer).lr_find(model, update_attr=False)
    print("lr suggested", found.suggestion() if found is not None else None)
else:
    Tuner(trainer).scale_batch_size(model, mode="power", max_trials=5, steps_per_trial=3)
    print("batch size", model.batch_size)
printer.fitting = True
trainer.fit(model)
print("steps", trainer.global_step)
