"""A physics-informed network in the shape of the PyTorch ports of Raissi's PINNs (the
``PhysicsInformedNN`` class of their Burgers and Schrödinger examples), here on a 1-D Poisson
problem, u'' = -π² sin(πx) on [-1, 1] with u(±1) = 0: the residual takes ``autograd.grad``
of the network's output by its inputs twice (``create_graph=True``); ``train`` runs an Adam
phase, then one ``LBFGS.step(self.loss_func)`` whose ``max_iter`` makes that one step run
long (50,000 in the ports: minutes). No sentinel import.

Prints the Adam losses every 100 steps, the LBFGS step's seconds and closure calls, and the
final loss.

argv: [ADAM_STEPS] [MAX_ITER] [EVAL_SECONDS] (a pause per closure call: a real collocation
set's forward and double backward)
"""

import sys
import time

import torch

adam_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
max_iter = int(sys.argv[2]) if len(sys.argv) > 2 else 400
eval_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
torch.manual_seed(0)


class DNN(torch.nn.Module):
    def __init__(self, layers: list[int]) -> None:
        super().__init__()
        mods: list[torch.nn.Module] = []
        for i in range(len(layers) - 2):
            mods += [torch.nn.Linear(layers[i], layers[i + 1]), torch.nn.Tanh()]
        mods.append(torch.nn.Linear(layers[-2], layers[-1]))
        self.layers = torch.nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class PhysicsInformedNN:
    def __init__(self) -> None:
        self.dnn = DNN([1, 20, 20, 20, 1])
        self.x = torch.linspace(-1, 1, 256).unsqueeze(1).requires_grad_(True)
        self.edges = torch.tensor([[-1.0], [1.0]])
        self.optimizer = torch.optim.LBFGS(self.dnn.parameters(), lr=1.0, max_iter=max_iter, max_eval=max_iter,
                                           history_size=50, tolerance_grad=1e-9,
                                           tolerance_change=1.0 * torch.finfo(torch.float32).eps,
                                           line_search_fn="strong_wolfe")
        self.optimizer_Adam = torch.optim.Adam(self.dnn.parameters())
        self.iter = 0

    def net_f(self) -> torch.Tensor:
        u = self.dnn(self.x)
        u_x = torch.autograd.grad(u, self.x, torch.ones_like(u), retain_graph=True, create_graph=True)[0]
        u_xx = torch.autograd.grad(u_x, self.x, torch.ones_like(u_x), retain_graph=True, create_graph=True)[0]
        return u_xx + torch.pi ** 2 * torch.sin(torch.pi * self.x)

    def loss(self) -> torch.Tensor:
        return torch.mean(self.net_f() ** 2) + torch.mean(self.dnn(self.edges) ** 2)

    def loss_func(self) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss = self.loss()
        loss.backward()
        self.iter += 1
        time.sleep(eval_seconds)
        return loss

    def train(self, n_iter: int) -> None:
        self.dnn.train()
        for epoch in range(n_iter):
            loss = self.loss()
            self.optimizer_Adam.zero_grad()
            loss.backward()
            self.optimizer_Adam.step()
            if epoch % 100 == 0:
                print(f"It: {epoch}, Loss: {loss.item()!r}", flush=True)
        t0 = time.monotonic()
        self.optimizer.step(self.loss_func)
        print(f"lbfgs: {time.monotonic() - t0:.1f} s, {self.iter} evaluations", flush=True)


model = PhysicsInformedNN()
model.train(adam_steps)
print(f"final {model.loss().item()!r}", flush=True)
