"""A DCGAN-style loop in the shape of the PyTorch examples' ``dcgan/main.py``: a generator
and a discriminator, one Adam each (the discriminator's created first), ``detach()`` of the
fake batch for the discriminator's update, ``BCELoss`` with real/fake labels.

The reference: per optimizer step, the loss whose ``backward()`` filled that optimizer's
gradients (errD_real + errD_fake for the discriminator, errG for the generator) and the
gradient norm of that optimizer's parameters.

argv: OUT_DIR [ITERS]
"""

import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 10
nz, ngf, ndf, nc, batch = 8, 8, 8, 1, 8
torch.manual_seed(999)


def weights_init(m: nn.Module) -> None:
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x).view(-1, 1).squeeze(1)


netG, netD = Generator(), Discriminator()
netG.apply(weights_init)
netD.apply(weights_init)
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
ref = zoolib.Reference(optimizers=2)

gen = torch.Generator().manual_seed(5)
real_label, fake_label = 1.0, 0.0
for i in range(iters):
    real = torch.tanh(torch.randn(batch, nc, 16, 16, generator=gen) + 0.5)
    # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
    netD.zero_grad()
    label = torch.full((batch,), real_label)
    errD_real = criterion(netD(real), label)
    errD_real.backward()
    noise = torch.randn(batch, nz, 1, 1, generator=gen)
    fake = netG(noise)
    label.fill_(fake_label)
    errD_fake = criterion(netD(fake.detach()), label)
    errD_fake.backward()
    errD = errD_real + errD_fake
    ref.step(errD, zoolib.total_norm(netD.parameters()), optimizer=0)
    optimizerD.step()
    # (2) update G: maximize log(D(G(z)))
    netG.zero_grad()
    label.fill_(real_label)
    errG = criterion(netD(fake), label)
    errG.backward()
    ref.step(errG, zoolib.total_norm(netG.parameters()), optimizer=1)
    optimizerG.step()
    print(f"[{i}/{iters}] Loss_D: {errD.item()!r} Loss_G: {errG.item()!r}")

os.makedirs(out_dir, exist_ok=True)
torch.save(netG.state_dict(), os.path.join(out_dir, "netG_epoch_0.pth"))
torch.save(netD.state_dict(), os.path.join(out_dir, "netD_epoch_0.pth"))
ref.saved_file(os.path.join(out_dir, "netG_epoch_0.pth"))
ref.saved_file(os.path.join(out_dir, "netD_epoch_0.pth"))
ref.finish(netD, netG)
