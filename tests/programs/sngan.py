"""A GAN in the shape of the SNGAN / HiFi-GAN scripts, on 2-D data: a discriminator under
``torch.nn.utils.spectral_norm`` (its weights become ``weight_orig`` with ``weight_u`` and
``weight_v`` buffers, a forward pre-hook re-normalizing them), a generator under
``torch.nn.utils.parametrizations.weight_norm`` (``parametrizations.weight.original0/1``),
the hinge loss, one Adam each (the discriminator's made and stepped first). At the end, the
generator's weight norm is folded back (``remove_parametrizations``) before its state dict
is saved, as a vocoder's export does, and loaded into a plain generator; a checkpoint holds
both models and both optimizers.

Both losses are measured against the other player: the generator's is the discriminator's
verdict, and rises as the discriminator learns. With them judged as losses, this healthy
run paged LossRising ("rose 11.4× over the last 39 steps") at step 142 and LossOscillation
at step 176 on the generator's stream; the same GAN with other losses and 3,000 steps paged
EarlyLossRising (critical) at step 87 (non-saturating BCE, least squares, softplus) and
LossDivergence (critical) with this one.

The reference: per optimizer step, the loss whose ``backward()`` filled that optimizer's
gradients and the gradient norm of its parameters.

argv: OUT_DIR [ITERS]
"""

import os
import sys

import torch
import zoolib
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrize, spectral_norm
from torch.nn.utils.parametrizations import weight_norm

out_dir = sys.argv[1]
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 400
torch.manual_seed(0)
gen = torch.Generator().manual_seed(1)
scale, shift = torch.tensor([0.3, 1.0]), torch.tensor([2.0, 0.0])


def generator(norm: bool) -> nn.Sequential:
    wrap = weight_norm if norm else (lambda m: m)
    return nn.Sequential(wrap(nn.Linear(8, 128)), nn.LeakyReLU(0.2), wrap(nn.Linear(128, 128)), nn.LeakyReLU(0.2),
                         nn.Linear(128, 2))


netD = nn.Sequential(spectral_norm(nn.Linear(2, 128)), nn.LeakyReLU(0.2), spectral_norm(nn.Linear(128, 128)),
                     nn.LeakyReLU(0.2), spectral_norm(nn.Linear(128, 1)))
netG = generator(norm=True)
optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
ref = zoolib.Reference(optimizers=2)
mons = []
if zoolib.watching():
    import sentinel

    mons = [sentinel.watch(netD, optD), sentinel.watch(netG, optG)]

for i in range(iters):
    real = torch.randn(128, 2, generator=gen) * scale + shift
    fake = netG(torch.randn(128, 8, generator=gen))
    optD.zero_grad()
    lossD = F.relu(1.0 - netD(real)).mean() + F.relu(1.0 + netD(fake.detach())).mean()
    lossD.backward()
    ref.step(lossD, zoolib.total_norm(netD.parameters()), optimizer=0)
    optD.step()
    if mons:
        mons[0].log(loss=lossD)
    optG.zero_grad()
    lossG = -netD(fake).mean()
    lossG.backward()
    ref.step(lossG, zoolib.total_norm(netG.parameters()), optimizer=1)
    optG.step()
    if mons:
        mons[1].log(loss=lossG)
    if i % 50 == 0:
        print(f"[{i}/{iters}] Loss_D: {lossD.item()!r} Loss_G: {lossG.item()!r}")

os.makedirs(out_dir, exist_ok=True)
torch.save({"netG": netG.state_dict(), "netD": netD.state_dict(), "optG": optG.state_dict(),
            "optD": optD.state_dict(), "iteration": iters}, os.path.join(out_dir, "checkpoint.pt"))
for m in netG:
    if parametrize.is_parametrized(m):
        parametrize.remove_parametrizations(m, "weight")
torch.save(netG.state_dict(), os.path.join(out_dir, "generator.pt"))
plain = generator(norm=False)
plain.load_state_dict(torch.load(os.path.join(out_dir, "generator.pt")))
with torch.no_grad():
    samples = plain(torch.randn(4000, 8, generator=gen))
print("fake mean", samples.mean(0).tolist(), "std", samples.std(0).tolist())
ref.saved_file(os.path.join(out_dir, "checkpoint.pt"))
ref.saved_file(os.path.join(out_dir, "generator.pt"))
ref.finish(netD, netG)
