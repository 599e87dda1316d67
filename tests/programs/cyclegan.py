"""A CycleGAN in the shape of junyanz/pytorch-CycleGAN-and-pix2pix's ``cycle_gan_model.py``,
on two 2-D domains: generators G_A (A to B) and G_B under one Adam over
``itertools.chain`` of both, discriminators D_A and D_B under another; per iteration the
generators' step first, with the discriminators frozen by ``set_requires_grad(..., False)``
(LSGAN losses, cycle losses weighted 10, identity losses weighted 5), then the
discriminators unfrozen and stepped on two ``backward()`` calls, each on a fake from an
image pool of 50; ``LambdaLR`` keeping the rate for half the epochs and decaying it
linearly to 0; each network's state dict saved as ``latest_net_*.pth``.

At the generators' first step the discriminators' parameters take no gradient, so zero-code
mode counted one optimizer alive and reported the two as one stream. Both losses are a
game's (the generators' is measured by the discriminators, who learn).

The reference: per optimizer step, the loss whose ``backward()`` calls filled that
optimizer's gradients (the discriminators': loss_D_A + loss_D_B) and the gradient norm of
its parameters.

argv: OUT_DIR [EPOCHS]
"""

import itertools
import os
import random
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 10
iters = 30
torch.manual_seed(0)
random.seed(0)
gen = torch.Generator().manual_seed(1)
domain_a = torch.randn(2048, 2, generator=gen) * 0.5 + torch.tensor([-2.0, 0.0])
domain_b = torch.randn(2048, 2, generator=gen) * torch.tensor([0.3, 1.0]) + torch.tensor([2.0, 1.0])


def mlp(n_in: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2),
                         nn.Linear(64, n_out))


def set_requires_grad(nets: list[nn.Module], requires_grad: bool) -> None:
    for net in nets:
        for param in net.parameters():
            param.requires_grad = requires_grad


class ImagePool:
    """The history of generated samples the discriminators see (the repo's ``image_pool.py``)."""

    def __init__(self, size: int) -> None:
        self.size, self.images = size, []

    def query(self, images: torch.Tensor) -> torch.Tensor:
        out = []
        for image in images.detach():
            image = image.unsqueeze(0)
            if len(self.images) < self.size:
                self.images.append(image)
                out.append(image)
            elif random.uniform(0, 1) > 0.5:
                i = random.randint(0, self.size - 1)
                out.append(self.images[i].clone())
                self.images[i] = image
            else:
                out.append(image)
        return torch.cat(out, 0)


netG_A, netG_B, netD_A, netD_B = mlp(2, 2), mlp(2, 2), mlp(2, 1), mlp(2, 1)
criterionGAN, criterionCycle, criterionIdt = nn.MSELoss(), nn.L1Loss(), nn.L1Loss()
optimizer_G = torch.optim.Adam(itertools.chain(netG_A.parameters(), netG_B.parameters()), lr=2e-4, betas=(0.5, 0.999))
optimizer_D = torch.optim.Adam(itertools.chain(netD_A.parameters(), netD_B.parameters()), lr=2e-4, betas=(0.5, 0.999))
half = epochs // 2
schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1.0 - max(0, e + 1 - half) / float(epochs - half + 1))
              for o in (optimizer_G, optimizer_D)]
fake_A_pool, fake_B_pool = ImagePool(50), ImagePool(50)
ref = zoolib.Reference(optimizers=2)


def gan_loss(prediction: torch.Tensor, is_real: bool) -> torch.Tensor:
    target = torch.ones_like(prediction) if is_real else torch.zeros_like(prediction)
    return criterionGAN(prediction, target)


def backward_D_basic(netD: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    loss_D = (gan_loss(netD(real), True) + gan_loss(netD(fake.detach()), False)) * 0.5
    loss_D.backward()
    return loss_D


for epoch in range(epochs):
    for i in range(iters):
        real_A = domain_a[torch.randint(0, 2048, (32,), generator=gen)]
        real_B = domain_b[torch.randint(0, 2048, (32,), generator=gen)]
        fake_B, fake_A = netG_A(real_A), netG_B(real_B)
        rec_A, rec_B = netG_B(fake_B), netG_A(fake_A)
        # G_A and G_B
        set_requires_grad([netD_A, netD_B], False)  # Ds require no gradients when optimizing Gs
        optimizer_G.zero_grad()
        loss_idt_A = criterionIdt(netG_A(real_B), real_B) * 10.0 * 0.5
        loss_idt_B = criterionIdt(netG_B(real_A), real_A) * 10.0 * 0.5
        loss_G = (gan_loss(netD_A(fake_B), True) + gan_loss(netD_B(fake_A), True)
                  + criterionCycle(rec_A, real_A) * 10.0 + criterionCycle(rec_B, real_B) * 10.0
                  + loss_idt_A + loss_idt_B)
        loss_G.backward()
        ref.step(loss_G, zoolib.total_norm(itertools.chain(netG_A.parameters(), netG_B.parameters())), optimizer=0)
        optimizer_G.step()
        # D_A and D_B
        set_requires_grad([netD_A, netD_B], True)
        optimizer_D.zero_grad()
        loss_D_A = backward_D_basic(netD_A, real_B, fake_B_pool.query(fake_B))
        loss_D_B = backward_D_basic(netD_B, real_A, fake_A_pool.query(fake_A))
        ref.step(loss_D_A + loss_D_B,
                 zoolib.total_norm(itertools.chain(netD_A.parameters(), netD_B.parameters())), optimizer=1)
        optimizer_D.step()
    for scheduler in schedulers:
        scheduler.step()
    print(f"epoch {epoch} G {loss_G.item()!r} D_A {loss_D_A.item()!r} D_B {loss_D_B.item()!r}")

os.makedirs(out_dir, exist_ok=True)
for name, net in (("G_A", netG_A), ("G_B", netG_B), ("D_A", netD_A), ("D_B", netD_B)):
    path = os.path.join(out_dir, f"latest_net_{name}.pth")
    torch.save(net.state_dict(), path)
    ref.saved_file(path)
ref.finish(netG_A, netG_B, netD_A, netD_B)
