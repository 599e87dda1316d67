"""The Forward-Forward algorithm in the shape of the PyTorch examples'
``mnist_forward_forward/main.py``: a ``Net`` whose layers are a plain list of ``Layer``
(``nn.Linear`` subclasses), each with its own Adam made in its ``__init__`` and a ``train``
method of its own (overriding ``nn.Module.train``) that runs all its epochs on the positive
and negative data; ``Net.train`` trains the layers one after the other. Every optimizer stays
alive with its layer while the next one trains. Synthetic prototypes in place of MNIST. No
sentinel import.

argv: [EPOCHS] [PAUSE] (seconds slept per epoch: a real dataset's full-batch epoch)
"""

import sys
import time

import torch
import torch.nn as nn
from torch.optim import Adam

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
torch.manual_seed(1)


def overlay_y_on_x(x: torch.Tensor, y: torch.Tensor | int) -> torch.Tensor:
    x_ = x.clone()
    x_[:, :10] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


class Net(torch.nn.Module):
    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.layers: list[Layer] = []
        for d in range(len(dims) - 1):
            self.layers = self.layers + [Layer(dims[d], dims[d + 1])]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        goodness_per_label = []
        for label in range(10):
            h = overlay_y_on_x(x, label)
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness = goodness + [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]  # type: ignore[union-attr]
        return torch.cat(goodness_per_label, 1).argmax(1)

    def train(self, x_pos: torch.Tensor, x_neg: torch.Tensor) -> None:  # type: ignore[override]
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            print("training layer", i, flush=True)
            h_pos, h_neg = layer.train(h_pos, h_neg)


class Layer(nn.Linear):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features)
        self.relu = torch.nn.ReLU()
        self.opt = Adam(self.parameters(), lr=0.03)
        self.threshold = 2.0
        self.num_epochs = epochs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train(self, x_pos: torch.Tensor, x_neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        for _ in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            time.sleep(pause)
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


y = torch.randint(0, 10, (500,))
protos = (torch.rand(10, 784) > 0.8).float()
x = (protos[y] + 0.3 * torch.rand(500, 784)).clamp(0, 1)
net = Net([784, 100, 100])
x_pos = overlay_y_on_x(x, y)
x_neg = overlay_y_on_x(x, y[torch.randperm(x.size(0))])
net.train(x_pos, x_neg)
print("train error:", 1.0 - net.predict(x).eq(y).float().mean().item(), flush=True)
