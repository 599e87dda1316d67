"""A Lightning ``fit`` with ``SentinelCallback``, and what its monitor exported after each
step, for tests/integration/test_framework_adapters.py.

Everything takes the Lightning package as an argument (``lightning.pytorch`` or the
standalone ``pytorch_lightning``). ``python lightning_fit.py standalone OUT`` runs a fit
in a Python where ``lightning`` cannot be imported (only ``pytorch_lightning``: the
adapter's fallback import) and writes what :class:`Recorder` saw to ``OUT`` as JSON.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.request
from typing import Any

import torch

METRICS = 20  # more step metrics than an adapter exports by default (16)


def exported(url: str) -> dict[str, Any]:
    """Rank 0's exported values on ``url``/metrics: the ``sentinel_*`` gauges by name,
    ``sentinel_scalar`` as ``scalar:NAME``, and ``sentinel_step``'s ``run`` label as ``run``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("rank") != "0":
                continue
            if s.name == "sentinel_scalar":
                out["scalar:" + s.labels["name"]] = s.value
            elif s.name in ("sentinel_step", "sentinel_loss", "sentinel_grad_norm"):
                out[s.name] = s.value
            if s.name == "sentinel_step":
                out["run"] = s.labels.get("run")
    return out


def module(pl: Any, metrics: int = 0, fail_at: int | None = None) -> Any:
    """A small regression LightningModule: logs ``metrics`` step values ``m00``... (``mI`` is
    the loss times I+1) and raises ``RuntimeError`` at global step ``fail_at`` + 1."""

    class Module(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
            self.losses: dict[int, float] = {}  # global step -> its loss

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if fail_at is not None and self.trainer.global_step == fail_at:
                raise RuntimeError("boom in training_step")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses[self.trainer.global_step + 1] = float(loss.detach())
            for i in range(metrics):
                self.log(f"m{i:02d}", loss * (i + 1), on_step=True, on_epoch=False)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    return Module()


def gan(pl: Any, g_every: int = 1) -> Any:
    """Lightning's GAN tutorial in small: manual optimization, two Adam optimizers stepped in
    turn, each with the other's parameters frozen (``toggle_optimizer``), ``self.log`` of
    each player's loss, and a ``training_step`` that returns nothing. ``g_every``: the
    generator steps at every ``g_every``-th batch only (the last of each run of them), as a
    WGAN's does. ``.grads`` keeps the squared norm of each player's gradients at its steps,
    ``.losses`` its losses, by player."""

    class Gan(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.automatic_optimization = False
            self.generator = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.LeakyReLU(0.2),
                                                 torch.nn.Linear(16, 8), torch.nn.Tanh())
            self.discriminator = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LeakyReLU(0.2),
                                                     torch.nn.Linear(16, 1), torch.nn.Sigmoid())
            self.grads: dict[str, list[float]] = {"generator": [], "discriminator": []}
            self.losses: dict[str, list[float]] = {"generator": [], "discriminator": []}

        def _player(self, opt: Any, loss: torch.Tensor, name: str) -> None:
            self.toggle_optimizer(opt)
            self.manual_backward(loss)
            self.grads[name].append(sum(float(p.grad.pow(2).sum()) for p in getattr(self, name).parameters()))
            self.losses[name].append(float(loss.detach()))
            opt.step()
            opt.zero_grad()
            self.untoggle_optimizer(opt)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            real = batch[0][:, :8].tanh()
            opt_g, opt_d = self.optimizers()
            z = torch.randn(real.shape[0], 4)
            bce = torch.nn.functional.binary_cross_entropy
            ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
            if (batch_idx + 1) % g_every == 0:
                self.toggle_optimizer(opt_g)  # frozen discriminator while the generator's loss is built
                g_loss = bce(self.discriminator(self.generator(z)), ones)
                self.untoggle_optimizer(opt_g)
                self.log("g_loss", g_loss, on_step=True, on_epoch=False)
                self._player(opt_g, g_loss, "generator")
            fake = self.generator(z).detach()
            d_loss = (bce(self.discriminator(real), ones) + bce(self.discriminator(fake), zeros)) / 2
            self.log("d_loss", d_loss, on_step=True, on_epoch=False)
            self._player(opt_d, d_loss, "discriminator")

        def configure_optimizers(self) -> Any:
            return [torch.optim.Adam(self.generator.parameters(), lr=2e-4, betas=(0.5, 0.999)),
                    torch.optim.Adam(self.discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))], []

    return Gan()


def data(batches: int = 8) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8 * batches, 8, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def recorder(pl: Any, adapter: Any) -> Any:
    """A callback (put it after ``adapter``) that, after each optimizer step, waits until the
    adapter's monitor exports a new ``sentinel_step`` and a loss, and keeps everything exported then,
    with the trainer's global step as ``global_step``, in ``.seen``; ``.monitor`` is the
    monitor the adapter made."""

    class Recorder(pl.Callback):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.seen: list[dict[str, Any]] = []
            self.monitor: Any = None
            self._last = -1

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.monitor = adapter.monitor
            self._last = trainer.global_step

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step == self._last or self.monitor is None or self.monitor.url is None:
                return  # accumulating, or nothing serves (engine off)
            self._last = trainer.global_step
            previous = self.seen[-1]["sentinel_step"] if self.seen else None
            deadline = time.monotonic() + 10
            while True:
                values = exported(self.monitor.url)
                # the step's loss may come in a frame after the step's own (log() after the step)
                if values.get("sentinel_step") not in (None, previous) and "sentinel_loss" in values:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"no new sentinel_step after global step {trainer.global_step}: {values}")
                time.sleep(0.01)
            self.seen.append({"global_step": trainer.global_step, **values})

    return Recorder()


def trainer(pl: Any, callbacks: list[Any], **kwargs: Any) -> Any:
    """A quiet CPU Trainer: no checkpointing, no logger unless ``logger=`` is given."""
    kwargs.setdefault("logger", False)
    kwargs.setdefault("default_root_dir", tempfile.mkdtemp())
    return pl.Trainer(accelerator="cpu", devices=1, callbacks=callbacks, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kwargs)


def fit(pl: Any, run: str, steps: int = 3, metrics: int = 2) -> dict[str, Any]:
    """``SentinelCallback(run=run)`` on a ``steps``-step fit; the module's losses and what
    was exported after each step."""
    from sentinel.integrations.lightning import SentinelCallback

    cb = SentinelCallback(run=run, engine="thread", listen="127.0.0.1:0")
    rec = recorder(pl, cb)
    mod = module(pl, metrics=metrics)
    trainer(pl, [cb, rec], max_steps=steps).fit(mod, data())
    return {"losses": {str(k): v for k, v in mod.losses.items()}, "seen": rec.seen, "base": type(cb).__mro__[1].__module__}


if __name__ == "__main__":
    if sys.argv[1] == "standalone":
        sys.modules["lightning"] = None  # type: ignore[assignment]  # only the standalone package
        import pytorch_lightning

        result = fit(pytorch_lightning, run="pl-standalone")
        result["lightning_imported"] = "lightning.pytorch" in sys.modules
        with open(sys.argv[2], "w") as f:
            json.dump(result, f)
