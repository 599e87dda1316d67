"""A sparse mixture of experts in the shape of davidmrau/mixture-of-experts (Shazeer et al.'s
noisily gated top-k MoE) and the MoE layers of small public LMs: 8 expert MLPs, a noisy top-2
gate, only the chosen experts run on their tokens, the load-balancing loss (the squared
coefficient of variation of importance and load) added to the task loss, Adam, and
``zero_grad()`` setting the gradients to None. A batch of 6 routes to some experts only, so
each step a different set of the experts' parameters has gradients (the others have None),
and a set seen before comes back: the per-group sums are taken over a changing subset.

The reference: per optimizer step, the loss (task loss plus the weighted balancing loss, what
``backward()`` is given) and the gradient norm.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import zoolib
from torch import nn
from torch.nn import functional as F

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
torch.manual_seed(9)
gen = torch.Generator().manual_seed(9)
d_in, d_out, hidden, n_experts, k, batch_size = 16, 4, 32, 8, 2, 6


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


def cv_squared(x: torch.Tensor) -> torch.Tensor:
    """The squared coefficient of variation: small when the experts share the batch evenly."""
    eps = 1e-10
    if x.shape[0] == 1:
        return torch.tensor([0.0])
    return x.float().var() / (x.float().mean() ** 2 + eps)


class MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(Expert() for _ in range(n_experts))
        self.w_gate = nn.Parameter(torch.zeros(d_in, n_experts))
        self.w_noise = nn.Parameter(torch.zeros(d_in, n_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        clean = x @ self.w_gate
        if self.training:
            noise_std = F.softplus(x @ self.w_noise) + 1e-2
            logits = clean + torch.randn(clean.shape, generator=gen) * noise_std
        else:
            logits = clean
        top_logits, top_idx = logits.topk(k, dim=1)
        top_gates = F.softmax(top_logits, dim=1)
        gates = torch.zeros_like(logits).scatter(1, top_idx, top_gates)
        importance = gates.sum(0)
        load = (gates > 0).sum(0)
        out = torch.zeros(x.shape[0], d_out)
        for e, expert in enumerate(self.experts):
            rows = (gates[:, e] > 0).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue  # this expert gets no token: its parameters get no gradient this step
            out = out.index_add(0, rows, gates[rows, e].unsqueeze(1) * expert(x[rows]))
        return out, cv_squared(importance) + cv_squared(load)


teacher = nn.Linear(d_in, d_out)
for p in teacher.parameters():
    p.requires_grad_(False)
model = MoE()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

with_grads = set()
for step in range(1, steps + 1):
    x = torch.randn(batch_size, d_in, generator=gen)
    y = torch.tanh(teacher(x)) + 0.05 * torch.randn(batch_size, d_out, generator=gen)
    model.train()
    optimizer.zero_grad()  # set_to_none: an expert without tokens has grad None
    out, aux = model(x)
    loss = F.mse_loss(out, y) + 1e-2 * aux
    loss.backward()
    with_grads.add(tuple(i for i, e in enumerate(model.experts) if e.fc1.weight.grad is not None))
    ref.step(loss, zoolib.total_norm(model.parameters()))
    optimizer.step()
    if mon is not None:
        mon.log(loss=loss)
    if step % 25 == 0:
        print(f"step {step} loss {loss.item()!r} aux {aux.item()!r}")
print(f"{len(with_grads)} different sets of experts with gradients")

os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "moe.pt"))
ref.saved_file(os.path.join(out_dir, "moe.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
