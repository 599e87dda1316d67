"""One model whose parameters are of several dtypes, as a float64 physics head on a float32
trunk, or a complex-valued layer (spectral/Fourier layers, as in FNO scripts), is trained:
a float32 trunk, a float64 head, a complex64 spectral weight; Adam over all of them (Adam
takes complex parameters as pairs of reals). ``--dtype float64`` trains one all-float64
model instead; ``--dtype complex`` a complex128 one.

argv: OUT_DIR [--dtype mixed|float64|complex] [--steps N]
"""

import argparse
import os

import torch
import zoolib
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("--dtype", default="mixed", choices=["mixed", "float64", "complex"])
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()
torch.manual_seed(11)


class Spectral(nn.Module):
    """Mixes the low Fourier modes of a signal with a complex weight."""

    def __init__(self, n: int, modes: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.modes = modes
        self.weight = nn.Parameter(torch.randn(modes, dtype=dtype) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.fft.rfft(x, dim=-1)
        low = f[..., :self.modes] * self.weight
        return torch.fft.irfft(torch.cat([low, torch.zeros_like(f[..., self.modes:])], dim=-1), n=x.shape[-1])


class Model(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        trunk = torch.float64 if mode == "float64" else torch.float32
        cdtype = torch.complex128 if mode in ("float64", "complex") else torch.complex64
        self.trunk = nn.Sequential(nn.Linear(16, 16, dtype=trunk), nn.Tanh())
        self.spectral = Spectral(16, 5, cdtype)
        head = torch.float32 if mode == "complex" else torch.float64
        self.head = nn.Linear(16, 1, dtype=head)
        self.trunk_dtype, self.head_dtype = trunk, head
        self.mode = mode
        if mode == "complex":
            self.trunk = nn.Sequential(nn.Linear(16, 16, dtype=torch.complex128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "complex":
            h = self.trunk(x.to(torch.complex128)).real
        else:
            h = self.trunk(x.to(self.trunk_dtype))
        h = self.spectral(h) if self.mode != "complex" else self.spectral(h.double()).float()
        return self.head(h.to(self.head_dtype))


model = Model(args.dtype)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)
gen = torch.Generator().manual_seed(11)
for step in range(args.steps):
    x = torch.randn(8, 16, generator=gen)
    y = x[:, :4].sum(dim=1, keepdim=True)
    out = model(x)
    loss = nn.functional.mse_loss(out, y.to(out.dtype))
    optimizer.zero_grad()
    loss.backward()
    ref.step(loss, zoolib.total_norm(model.parameters()))
    optimizer.step()
    if mon is not None:
        mon.log(loss=loss)
    print(f"step {step} loss {loss.item()!r} {sorted({str(p.dtype) for p in model.parameters()})}")
os.makedirs(args.out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(args.out_dir, "model.pt"))
ref.saved_file(os.path.join(args.out_dir, "model.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
