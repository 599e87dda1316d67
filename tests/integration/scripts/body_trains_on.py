"""A model dropped while its parts train on: a network whose first layer is replaced and
added to the optimizer (a re-initialised stem), then the wrapper dropped and its body
trained on its own (``body = net.body; del net``). No sentinel import. Prints each
phase's last loss with repr.

Under ``sentinel run`` it is one training of 60 steps: zero-code mode closes the monitor
of a model the script dropped (its training is over), but not while a part of it, holding
the watched parameters, still trains.
"""

import torch
from torch import nn

torch.manual_seed(0)
x, y = torch.randn(256, 32), torch.randn(256, 1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


net = Net()
opt = torch.optim.Adam(net.parameters(), lr=1e-3)


def train(model: nn.Module, steps: int) -> float:
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return loss.item()


print("whole", repr(train(net, 20)))
net.body[0] = nn.Linear(32, 64)
opt.add_param_group({"params": net.body[0].parameters()})
print("new stem", repr(train(net, 20)))
body = net.body
del net
print("body alone", repr(train(body, 20)))
