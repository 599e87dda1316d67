"""The first training programs of d2l.ai ("Dive into Deep Learning"), run as the book
writes them: nothing critical fires.

- Linear regression, concise (3.3): ``nn.Linear(2, 1)`` with weights drawn with a standard
  deviation of 0.01 and a zero bias, ``MSELoss``, SGD at lr 0.03 on batches of 10 of 1,000
  synthetic samples, 3 epochs. Its first updates are 4,300 %, 150 % and 32 % of the
  weights, which grow from 0.01 to the true (2, -3.4, 4.2), while its batch losses fall
  from 35 to 6 in ten steps, as noisy as 46 at step 2. ``EarlyUpdateTooLarge`` paged it,
  critical, at step 3.
- Softmax regression, concise (4.5), on images shaped like Fashion-MNIST's (784 values in
  [0, 1], 10 classes, batches of 256): weights of standard deviation 0.01, SGD at lr 0.1.
  Its updates are 18-29 % of the weights for twelve steps while its loss falls at each, from
  2.31 to 1.13; ``EarlyUpdateTooLarge`` paged it at step 13, its first loss above the one
  before.

The learning rates are the book's, and the runs train well. Real monitor, real engine, in
this process. The linear regression's tiny updates once it sits at its noise floor warned
``UpdateRatioLow`` (an lr too small) at step 200: no longer."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils import data

from tests.helpers import make_monitor


def _step(loss: torch.Tensor, trainer: torch.optim.Optimizer, mon: object, losses: list[float]) -> None:
    """The book's step: zero the gradients, backward, step; and the loss logged."""
    trainer.zero_grad()
    loss.backward()
    trainer.step()
    mon.log(loss=loss)  # type: ignore[attr-defined]
    losses.append(loss.item())


def _fired(sender: object) -> list[tuple[str, str, int]]:
    return [(t.alertname, t.severity, t.step) for t in sender.engine.transitions  # type: ignore[attr-defined]
            if t.state_to == "firing"]


def test_linear_regression_from_weights_of_a_hundredth() -> None:
    torch.manual_seed(0)
    true_w, true_b = torch.tensor([2, -3.4]), 4.2
    features = torch.normal(0, 1, (1000, 2))
    labels = (features @ true_w + true_b + torch.normal(0, 0.01, (1000,))).reshape(-1, 1)
    loader = data.DataLoader(data.TensorDataset(features, labels), 10, shuffle=True)
    net = nn.Sequential(nn.Linear(2, 1))
    net[0].weight.data.normal_(0, 0.01)
    net[0].bias.data.fill_(0)
    trainer = torch.optim.SGD(net.parameters(), lr=0.03)
    mon, sender = make_monitor(net, trainer)
    losses: list[float] = []
    try:
        for _ in range(3):
            for x, y in loader:
                _step(nn.functional.mse_loss(net(x), y), trainer, mon, losses)
    finally:
        mon.close()
    # the run is the book's: it finds the weights, its first batches noisy
    assert torch.allclose(net[0].weight.data, true_w.reshape(1, 2), atol=0.01)
    assert max(losses[:3]) > losses[0] and losses[9] < losses[0] / 2
    assert [f for f in _fired(sender) if f[1] == "critical"] == []
    # at its noise floor (a loss of 5e-5 from 35) its updates are tiny by its own success:
    # UpdateRatioLow warned at step 200 that the lr was too small (sentinel/rules/scheduled.py)
    assert max(losses[-10:]) < 1e-3 * losses[0]
    assert "UpdateRatioLow" not in [f[0] for f in _fired(sender)]


def test_softmax_regression_from_weights_of_a_hundredth() -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    prototypes = torch.rand(10, 784, generator=gen)
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    nn.init.normal_(net[1].weight, std=0.01)
    nn.init.zeros_(net[1].bias)
    trainer = torch.optim.SGD(net.parameters(), lr=0.1)
    mon, sender = make_monitor(net, trainer)
    losses: list[float] = []
    try:
        for _ in range(120):
            y = torch.randint(0, 10, (256,), generator=gen)
            x = (0.5 * prototypes[y] + 0.5 * torch.rand(256, 784, generator=gen)).reshape(256, 1, 28, 28)
            _step(nn.functional.cross_entropy(net(x), y), trainer, mon, losses)
    finally:
        mon.close()
    assert all(b < a for a, b in zip(losses[:12], losses[1:12])) and losses[-1] < 0.5
    assert [f for f in _fired(sender) if f[1] == "critical"] == []
