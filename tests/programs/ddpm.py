"""A denoising diffusion model (DDPM) in the shape of the small public trainers (tanelp's
tiny-diffusion, the diffusers ``train_unconditional.py`` loop on toy data): an MLP over 2-D
points with a sinusoidal timestep embedding, a linear beta schedule of 1,000 timesteps,
each batch noised at timesteps drawn uniformly, the noise predicted and ``F.mse_loss`` taken
against it, AdamW, a cosine schedule with warmup (``get_cosine_schedule_with_warmup``'s
formula in a ``LambdaLR``), ``clip_grad_norm_(…, 1.0)``, an EMA copy of the weights
updated after every step, and the EMA's state dict saved at the end.

The loss is noisy by nature: a batch of 32 points drawn at 32 random timesteps; a small
timestep's noise is hard to tell from the data, a large one's is almost the input itself.
Per batch it moves by about a third around its level for the whole run, while it falls
from 1.0 to about 0.35 in the first epochs and then flattens. That is a healthy run.

The reference: per optimizer step, the loss, the gradient norm after clipping and before.

argv: OUT_DIR [EPOCHS]
"""

import copy
import math
import os
import sys

import torch
import zoolib
from torch import nn
from torch.nn import functional as F

out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 24
torch.manual_seed(5)
gen = torch.Generator().manual_seed(5)
n, batch_size, T = 1024, 32, 1000


def moons(count: int) -> torch.Tensor:
    """Two interleaved half circles, scaled to about unit variance (sklearn's make_moons)."""
    half = count // 2
    a = torch.rand(half, generator=gen) * math.pi
    b = torch.rand(count - half, generator=gen) * math.pi
    outer = torch.stack([torch.cos(a), torch.sin(a)], 1)
    inner = torch.stack([1 - torch.cos(b), 0.5 - torch.sin(b)], 1)
    x = torch.cat([outer, inner]) + 0.05 * torch.randn(count, 2, generator=gen)
    return (x - x.mean(0)) / x.std(0)


class SinusoidalEmbedding(nn.Module):
    def __init__(self, size: int, scale: float = 1.0) -> None:
        super().__init__()
        self.size, self.scale = size, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.scale
        half = self.size // 2
        emb = torch.exp(-math.log(10000.0) * torch.arange(half) / (half - 1))
        emb = x.unsqueeze(-1) * emb.unsqueeze(0)
        return torch.cat((torch.sin(emb), torch.cos(emb)), dim=-1)


class Block(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.ff = nn.Linear(size, size)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.ff(x))


class MLP(nn.Module):
    def __init__(self, hidden: int = 64, layers: int = 3, emb: int = 32) -> None:
        super().__init__()
        self.time_mlp = SinusoidalEmbedding(emb)
        self.input_mlp1 = SinusoidalEmbedding(emb, scale=25.0)
        self.input_mlp2 = SinusoidalEmbedding(emb, scale=25.0)
        net: list[nn.Module] = [nn.Linear(3 * emb, hidden), nn.GELU()]
        net += [Block(hidden) for _ in range(layers)]
        net.append(nn.Linear(hidden, 2))
        self.joint_mlp = nn.Sequential(*net)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = torch.cat((self.input_mlp1(x[:, 0]), self.input_mlp2(x[:, 1]), self.time_mlp(t)), dim=-1)
        return self.joint_mlp(h)


class NoiseScheduler:
    def __init__(self, num_timesteps: int = T, beta_start: float = 0.0001, beta_end: float = 0.02) -> None:
        self.betas = torch.linspace(beta_start, beta_end, num_timesteps, dtype=torch.float32)
        self.alphas_cumprod = torch.cumprod(1.0 - self.betas, dim=0)
        self.sqrt_alphas_cumprod = self.alphas_cumprod ** 0.5
        self.sqrt_one_minus_alphas_cumprod = (1 - self.alphas_cumprod) ** 0.5

    def add_noise(self, x_start: torch.Tensor, x_noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        s1 = self.sqrt_alphas_cumprod[timesteps].reshape(-1, 1)
        s2 = self.sqrt_one_minus_alphas_cumprod[timesteps].reshape(-1, 1)
        return s1 * x_start + s2 * x_noise


def cosine_with_warmup(warmup: int, total: int):  # type: ignore[no-untyped-def]
    def f(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return f


data = moons(n)
model = MLP()
ema = copy.deepcopy(model).requires_grad_(False)
scheduler = NoiseScheduler()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps_total = epochs * (n // batch_size)
lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(50, steps_total))
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

global_step = 0
for epoch in range(epochs):
    model.train()
    perm = torch.randperm(n, generator=gen)
    for start in range(0, n, batch_size):
        batch = data[perm[start:start + batch_size]]
        noise = torch.randn(batch.shape, generator=gen)
        timesteps = torch.randint(0, T, (batch.shape[0],), generator=gen).long()
        noisy = scheduler.add_noise(batch, noise, timesteps)
        noise_pred = model(noisy, timesteps)
        loss = F.mse_loss(noise_pred, noise)
        loss.backward()
        preclip = float(nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        ref.step(loss, zoolib.total_norm(model.parameters()), preclip=preclip)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        with torch.no_grad():  # diffusers' EMAModel.step, a fixed decay
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.995).add_(p.detach(), alpha=0.005)
        if mon is not None:
            mon.log(loss=loss)
        global_step += 1
        if global_step % 32 == 0:
            print(f"epoch {epoch} step {global_step} loss {loss.item()!r} lr {lr_scheduler.get_last_lr()[0]!r}")

os.makedirs(out_dir, exist_ok=True)
torch.save(ema.state_dict(), os.path.join(out_dir, "ema.pt"))
ref.saved_file(os.path.join(out_dir, "ema.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
