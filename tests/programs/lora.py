"""Low-rank adaptation of a pretrained network, in the shape of microsoft/LoRA's ``loralib``
and the hand-written LoRA layers many fine-tuning scripts copy from it: each linear layer of
a small MLP (its initial weights stand for the pretrained ones a script loads) gets ``lora_A`` (r x in,
Kaiming-uniform) and ``lora_B`` (out x r, **zeros**) scaled by ``alpha / r``;
``mark_only_lora_as_trainable`` freezes everything else; AdamW over the trainable
parameters only; a new task (a shifted target) fine-tuned for 200 steps; only the LoRA
weights saved (``lora_state_dict``).

``lora_B`` starts at zero, so each adapter's update at the first step is large next to a
weight of norm zero: an update ratio with a zero denominator, as every LoRA run has.

The reference: per optimizer step of the fine-tuning, the loss and the gradient norm.

argv: OUT_DIR [STEPS]
"""

import math
import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
torch.manual_seed(21)
gen = torch.Generator().manual_seed(21)


class LoRALinear(nn.Linear):
    """``loralib.Linear``: the frozen weight plus ``B @ A`` times ``alpha / r``."""

    def __init__(self, in_features: int, out_features: int, r: int = 4, alpha: int = 8) -> None:
        super().__init__(in_features, out_features)
        self.lora_A = nn.Parameter(self.weight.new_zeros((r, in_features)))
        self.lora_B = nn.Parameter(self.weight.new_zeros((out_features, r)))
        self.scaling = alpha / r
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + (x @ self.lora_A.transpose(0, 1) @ self.lora_B.transpose(0, 1)) * self.scaling


def mark_only_lora_as_trainable(model: nn.Module) -> None:
    for name, p in model.named_parameters():
        p.requires_grad = "lora_" in name


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if "lora_" in k}


model = nn.Sequential(LoRALinear(16, 64), nn.GELU(), LoRALinear(64, 64), nn.GELU(), LoRALinear(64, 1))
w_true = torch.randn(16, 1, generator=gen)


def batch(shift: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(64, 16, generator=gen)
    return x, torch.tanh(x @ w_true) + shift * x[:, :1] ** 2


mark_only_lora_as_trainable(model)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)
for step in range(1, steps + 1):
    x, y = batch(0.5)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    ref.step(loss, zoolib.total_norm(p for p in model.parameters() if p.requires_grad))
    optimizer.step()
    if mon is not None:
        mon.log(loss=loss)
    if step % 40 == 0:
        print(f"step {step} loss {loss.item()!r}")

os.makedirs(out_dir, exist_ok=True)
torch.save(lora_state_dict(model), os.path.join(out_dir, "lora.pt"))
ref.saved_file(os.path.join(out_dir, "lora.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
