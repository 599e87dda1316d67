"""A WGAN loop in the shape of the original ``WassersteinGAN/main.py`` and its many copies:
an MLP generator and critic, one RMSprop each, ``n_critic`` critic steps per generator
step, the critic's weights clamped by hand after each of its steps, and the losses handed
to autograd with explicit gradients: ``errD_real.backward(one)``, ``errD_fake.backward(mone)``
(``one = torch.FloatTensor([1])``, ``mone = one * -1``), ``errG.backward(one)``.

The reference: per optimizer step, the loss whose gradients the step applies:
``errD_real - errD_fake`` for the critic (what the script prints as ``Loss_D``), ``errG`` for
the generator, and the gradient norm of that optimizer's parameters.

argv: OUT_DIR [GEN_ITERS]
"""

import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
gen_iters = int(sys.argv[2]) if len(sys.argv) > 2 else 6
nz, dim, batch, n_critic, clamp = 4, 2, 16, 5, 0.05
torch.manual_seed(31)

netG = nn.Sequential(nn.Linear(nz, 32), nn.ReLU(True), nn.Linear(32, dim))
netD = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(True), nn.Linear(32, 1))
optimizerD = torch.optim.RMSprop(netD.parameters(), lr=5e-4)
optimizerG = torch.optim.RMSprop(netG.parameters(), lr=5e-4)
one = torch.FloatTensor([1])
mone = one * -1
ref = zoolib.Reference(optimizers=2)
gen = torch.Generator().manual_seed(7)

for it in range(gen_iters):
    for p in netD.parameters():
        p.requires_grad = True
    for _ in range(n_critic):
        for p in netD.parameters():
            p.data.clamp_(-clamp, clamp)
        real = torch.randn(batch, dim, generator=gen) * 0.3 + 1.0
        netD.zero_grad()
        errD_real = netD(real).mean(0).view(1)
        errD_real.backward(one)
        with torch.no_grad():
            fake = netG(torch.randn(batch, nz, generator=gen))
        errD_fake = netD(fake).mean(0).view(1)
        errD_fake.backward(mone)
        errD = errD_real - errD_fake
        ref.step(errD, zoolib.total_norm(netD.parameters()), optimizer=0)
        optimizerD.step()
    for p in netD.parameters():
        p.requires_grad = False
    netG.zero_grad()
    errG = netD(netG(torch.randn(batch, nz, generator=gen))).mean(0).view(1)
    errG.backward(one)
    ref.step(errG, zoolib.total_norm(netG.parameters()), optimizer=1)
    optimizerG.step()
    print(f"[{it}/{gen_iters}] Loss_D: {errD.item()!r} Loss_G: {errG.item()!r}")

os.makedirs(out_dir, exist_ok=True)
torch.save(netG.state_dict(), os.path.join(out_dir, "netG.pth"))
ref.saved_file(os.path.join(out_dir, "netG.pth"))
ref.finish(netD, netG)
