"""Small real models and synthetic tasks for the detection scenarios (CPU, a few ms a step).

Three families, so a clean run of each is a meaningful "no false alarm" check:

- ``mlp``: a tanh MLP regressing a fixed random teacher network plus label noise;
- ``cnn``: a small conv net classifying which quadrant of a noisy image holds a bright
  patch;
- ``gpt``: :class:`~sentinel.demo.model.TinyGPT` on the stride-sequence task of the demo.

Each task draws its batches from a :class:`torch.Generator`, so a run is reproducible, and
can corrupt a batch (extreme labels) or break the data pipeline (labels that no longer
depend on the inputs), which the fault injectors of :mod:`sentinel.demo.scenarios` use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch import nn

from sentinel.demo.model import TinyGPT, loss_fn, synthetic_batch

ModelName = Literal["mlp", "cnn", "gpt"]
OptimizerName = Literal["sgd", "adamw", "adafactor", "adam", "lamb", "lion", "sophia"]
Batch = tuple[torch.Tensor, torch.Tensor]

MODELS: tuple[ModelName, ...] = ("mlp", "cnn", "gpt")
OPTIMIZERS: tuple[OptimizerName, ...] = ("sgd", "adamw", "adafactor")
"""The optimizers every model is trained with in the clean scenario matrix."""
MORE_OPTIMIZERS: tuple[OptimizerName, ...] = ("adam", "lamb", "lion", "sophia")
"""The rest of the seeds' six (seed 000 §2): torch's Adam, and LAMB, Lion and Sophia from
pytorch-optimizer (the dev extra), each trained on the mlp."""

# learning rates at which each (model, optimizer) trains well; the faults multiply these
DEFAULT_LR: dict[tuple[ModelName, OptimizerName], float] = {
    ("mlp", "sgd"): 0.02, ("mlp", "adamw"): 3e-3, ("mlp", "adafactor"): 1e-2,
    ("cnn", "sgd"): 0.03, ("cnn", "adamw"): 3e-3, ("cnn", "adafactor"): 1e-2,
    ("gpt", "sgd"): 0.1, ("gpt", "adamw"): 3e-3, ("gpt", "adafactor"): 1e-2,
    ("mlp", "adam"): 3e-3, ("mlp", "lamb"): 3e-3, ("mlp", "lion"): 3e-4, ("mlp", "sophia"): 3e-3,
}  # fmt: skip


class MLP(nn.Module):
    """``depth`` tanh blocks in a ModuleList plus a head: groups ``layers.N`` and ``head``."""

    def __init__(self, width: int = 32, depth: int = 3, inputs: int = 16) -> None:
        super().__init__()
        sizes = [inputs] + [width] * depth
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(sizes, sizes[1:])
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head: groups ``features.0``, ``features.3``, ``head``."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )  # fmt: skip
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Task:
    """A model, its data and its loss.

    Args:
        name: ``mlp``, ``cnn`` or ``gpt``.
        seed: seeds the model's initialisation and the batches.
        batch: samples per batch.
        label_noise: the fraction of targets replaced by a random class or token (cnn,
            gpt): a noisy-label classifier, a language model with a real loss floor.
    """

    def __init__(self, name: ModelName, seed: int = 0, batch: int = 16, label_noise: float = 0.0) -> None:
        if name not in MODELS:
            raise ValueError(f"model: expected one of {', '.join(MODELS)}, got {name!r}")
        self.name, self.batch_size, self.label_noise = name, batch, label_noise
        torch.manual_seed(seed)
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.model: nn.Module
        if name == "mlp":
            self.model = MLP()
            self._teacher = MLP(width=16, depth=2).requires_grad_(False)
        elif name == "cnn":
            self.model = SmallCNN()
        else:
            self.model = TinyGPT(vocab=64, dim=32, depth=2, heads=4, seq=16)

    def batch(self, only_class: int | None = None) -> Batch:
        """The next clean batch ``(inputs, targets)``.

        Args:
            only_class: for the cnn, draw every sample from this class (a loader over
                data sorted by label); ignored by the other tasks.
        """
        g, n = self.gen, self.batch_size
        if self.name == "mlp":
            x = torch.randn(n, 16, generator=g)
            return x, 4.0 * self._teacher(x) + 0.1 * torch.randn(n, 1, generator=g)
        if self.name == "cnn":
            x = 0.5 * torch.randn(n, 1, 12, 12, generator=g)
            y = torch.randint(0, 4, (n,), generator=g)
            if only_class is not None:
                y = torch.full((n,), only_class % 4)
            for i, q in enumerate(y.tolist()):
                r, c = 6 * (q // 2), 6 * (q % 2)
                x[i, 0, r + 1 : r + 5, c + 1 : c + 5] += 2.0
            return x, self._noisy(y, 4)
        x, y = synthetic_batch(g, n, 16, 64)
        return x, self._noisy(y, 64)

    def _noisy(self, y: torch.Tensor, classes: int) -> torch.Tensor:
        if self.label_noise <= 0.0:
            return y
        flip = torch.rand(y.shape, generator=self.gen) < self.label_noise
        return torch.where(flip, torch.randint(0, classes, y.shape, generator=self.gen), y)

    def garbage(self, x: torch.Tensor, y: torch.Tensor, fraction: float) -> Batch:
        """A bad batch: the first ``fraction`` of its rows replaced by noise (random tokens
        with shuffled targets for the gpt, random labels for the cnn, targets of the
        wrong sign for the mlp), the rest intact."""
        g, k = self.gen, max(1, int(round(fraction * len(x))))
        x, y = x.clone(), y.clone()
        if self.name == "gpt":
            x[:k] = torch.randint(0, 64, x[:k].shape, generator=g)
            y[:k] = y[:k].flatten()[torch.randperm(y[:k].numel(), generator=g)].view_as(y[:k])
        elif self.name == "cnn":
            y[:k] = torch.randint(0, 4, y[:k].shape, generator=g)
        else:
            y[:k] = -y[:k]
        return x, y

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The task's loss: MSE (mlp) or cross-entropy (cnn, gpt)."""
        if self.name == "mlp":
            return nn.functional.mse_loss(out, y)
        if self.name == "cnn":
            return nn.functional.cross_entropy(out, y)
        return loss_fn(out, y)

    def corrupt(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        """One corrupt batch: extreme values where the task allows them (inputs ×100 for
        the mlp and cnn, every target replaced by one token for the gpt)."""
        if self.name == "gpt":
            return x, torch.zeros_like(y)
        return x * 100.0, y

    def unlearnable(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        """The same batch with targets that no longer depend on the inputs (a data bug)."""
        g = self.gen
        if self.name == "mlp":
            return x, torch.randn(y.shape, generator=g)
        hi = 4 if self.name == "cnn" else 64
        return x, torch.randint(0, hi, y.shape, generator=g)


def make_optimizer(name: OptimizerName, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """``sgd`` (momentum 0.9), ``adamw``, ``adam``, ``adafactor`` (``torch.optim.Adafactor``),
    or ``lamb``, ``lion``, ``sophia`` (pytorch-optimizer's ``Lamb``, ``Lion``, ``SophiaH``;
    imported here, so the demo needs the package only for them).

    Raises:
        ValueError: an unknown name.
        ImportError: pytorch-optimizer is not installed (for lamb, lion, sophia).
    """
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr)
    if name in ("lamb", "lion", "sophia"):
        import pytorch_optimizer as po

        if name == "lamb":
            return po.Lamb(params, lr=lr, weight_decay=0.01)
        if name == "lion":
            return po.Lion(params, lr=lr, weight_decay=0.01)
        return po.SophiaH(params, lr=lr, update_period=5)
    raise ValueError(f"optimizer: expected one of {', '.join(OPTIMIZERS + MORE_OPTIMIZERS)}, got {name!r}")


def needs_graph(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` estimates curvature from the backward graph (Sophia's Hutchinson
    estimate needs ``backward(create_graph=True)``)."""
    return type(opt).__name__ == "SophiaH"


def backward_and_step(loss: torch.Tensor, opt: torch.optim.Optimizer, scaler: Any = None,
                      after_backward: Callable[[], None] | None = None) -> None:
    """One training step's backward and optimizer step, through a GradScaler if given
    (which may skip the step on inf/NaN gradients and lower its scale)."""
    (scaler.scale(loss) if scaler is not None else loss).backward(create_graph=needs_graph(opt))
    if after_backward is not None:
        after_backward()
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
