"""A GAN in the shape of rosinality/stylegan2-pytorch's ``train.py`` (and the StyleGAN2
ports that copy it), on 8×8 images: a mapping network and a synthesis network, the
logistic (non-saturating) losses, and **lazy regularization**. Every ``D_REG_EVERY``
iterations the discriminator takes a second step on the R1 penalty alone (the gradient of
its verdict on real images, from ``autograd.grad(…, create_graph=True)``, weighted by
``r1 / 2 × D_REG_EVERY``), and every ``G_REG_EVERY`` iterations the generator takes a
second step on the path-length penalty (the gradient of the image times noise by the
latents, against its running mean). So each optimizer steps on two objectives of different
scales, the regularization step's loss being ``penalty + 0 * output[0]`` as the script
writes it. The optimizers' rates and betas are scaled by ``reg_every / (reg_every + 1)``
(the generator's beta1 is ``0 ** ratio = 0``); ``requires_grad`` is toggled per phase;
``g_ema`` follows the generator by ``accumulate``; the checkpoint holds the three models
and both optimizers.

The reference: per optimizer step, the loss whose ``backward()`` filled that optimizer's
gradients (the penalty at a regularization step) and the gradient norm of its parameters.

argv: OUT_DIR [ITERS]
"""

import copy
import math
import os
import sys

import torch
import zoolib
from torch import autograd, nn
from torch.nn import functional as F

out_dir = sys.argv[1]
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 320
torch.manual_seed(0)
gen = torch.Generator().manual_seed(1)
LATENT, SIDE, BATCH = 16, 8, 32
D_REG_EVERY, G_REG_EVERY, R1, PATH_REGULARIZE, PATH_BATCH_SHRINK = 16, 4, 10.0, 2.0, 2


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.style = nn.Sequential(nn.Linear(LATENT, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2))
        self.synthesis = nn.Sequential(nn.Linear(64, 128), nn.LeakyReLU(0.2), nn.Linear(128, SIDE * SIDE))

    def forward(self, z: torch.Tensor, return_latents: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        latent = self.style(z)
        image = torch.tanh(self.synthesis(latent)).view(-1, 1, SIDE, SIDE)
        return image, (latent if return_latents else None)


discriminator = nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 128), nn.LeakyReLU(0.2),
                              nn.Linear(128, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
generator = Generator()
g_ema = copy.deepcopy(generator).eval()


def requires_grad(model: nn.Module, flag: bool = True) -> None:
    for p in model.parameters():
        p.requires_grad = flag


def accumulate(model1: nn.Module, model2: nn.Module, decay: float = 0.999) -> None:
    par1, par2 = dict(model1.named_parameters()), dict(model2.named_parameters())
    for k in par1:
        par1[k].data.mul_(decay).add_(par2[k].data, alpha=1 - decay)


def d_logistic_loss(real_pred: torch.Tensor, fake_pred: torch.Tensor) -> torch.Tensor:
    return F.softplus(-real_pred).mean() + F.softplus(fake_pred).mean()


def d_r1_loss(real_pred: torch.Tensor, real_img: torch.Tensor) -> torch.Tensor:
    grad_real, = autograd.grad(outputs=real_pred.sum(), inputs=real_img, create_graph=True)
    return grad_real.pow(2).reshape(grad_real.shape[0], -1).sum(1).mean()


def g_nonsaturating_loss(fake_pred: torch.Tensor) -> torch.Tensor:
    return F.softplus(-fake_pred).mean()


def g_path_regularize(fake_img: torch.Tensor, latents: torch.Tensor, mean_path_length: torch.Tensor,
                      decay: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    noise = torch.randn(fake_img.shape, generator=gen) / math.sqrt(fake_img.shape[2] * fake_img.shape[3])
    grad, = autograd.grad(outputs=(fake_img * noise).sum(), inputs=latents, create_graph=True)
    path_lengths = torch.sqrt(grad.pow(2).sum(1))
    path_mean = mean_path_length + decay * (path_lengths.mean() - mean_path_length)
    path_penalty = (path_lengths - path_mean).pow(2).mean()
    return path_penalty, path_mean.detach(), path_lengths


def real_images(n: int) -> torch.Tensor:
    """Soft blobs at random places: a distribution with some structure to learn."""
    ys, xs = torch.meshgrid(torch.arange(SIDE).float(), torch.arange(SIDE).float(), indexing="ij")
    centre = torch.rand(n, 2, generator=gen) * (SIDE - 1)
    d2 = (ys - centre[:, 0, None, None]) ** 2 + (xs - centre[:, 1, None, None]) ** 2
    return (2 * torch.exp(-d2 / 4) - 1).unsqueeze(1)


g_reg_ratio = G_REG_EVERY / (G_REG_EVERY + 1)
d_reg_ratio = D_REG_EVERY / (D_REG_EVERY + 1)
g_optim = torch.optim.Adam(generator.parameters(), lr=2e-3 * g_reg_ratio, betas=(0 ** g_reg_ratio, 0.99 ** g_reg_ratio))
d_optim = torch.optim.Adam(discriminator.parameters(), lr=2e-3 * d_reg_ratio,
                           betas=(0 ** d_reg_ratio, 0.99 ** d_reg_ratio))
ref = zoolib.Reference(optimizers=2)  # 0: the generator's (made first), 1: the discriminator's
mons = []
if zoolib.watching():
    import sentinel

    mons = [sentinel.watch(generator, g_optim), sentinel.watch(discriminator, d_optim)]

mean_path_length = torch.tensor(0.0)
for i in range(iters):
    real_img = real_images(BATCH)

    requires_grad(generator, False)
    requires_grad(discriminator, True)
    fake_img, _ = generator(torch.randn(BATCH, LATENT, generator=gen))
    fake_pred = discriminator(fake_img)
    real_pred = discriminator(real_img)
    d_loss = d_logistic_loss(real_pred, fake_pred)
    discriminator.zero_grad()
    d_loss.backward()
    ref.step(d_loss, zoolib.total_norm(discriminator.parameters()), optimizer=1)
    d_optim.step()
    if mons:
        mons[1].log(loss=d_loss)

    if i % D_REG_EVERY == 0:
        real_img.requires_grad = True
        real_pred = discriminator(real_img)
        r1_loss = d_r1_loss(real_pred, real_img)
        discriminator.zero_grad()
        weighted = R1 / 2 * r1_loss * D_REG_EVERY + 0 * real_pred[0]
        weighted.backward()
        ref.step(weighted, zoolib.total_norm(discriminator.parameters()), optimizer=1)
        d_optim.step()
        if mons:
            mons[1].log(loss=weighted)

    requires_grad(generator, True)
    requires_grad(discriminator, False)
    fake_img, _ = generator(torch.randn(BATCH, LATENT, generator=gen))
    fake_pred = discriminator(fake_img)
    g_loss = g_nonsaturating_loss(fake_pred)
    generator.zero_grad()
    g_loss.backward()
    ref.step(g_loss, zoolib.total_norm(generator.parameters()), optimizer=0)
    g_optim.step()
    if mons:
        mons[0].log(loss=g_loss)

    if i % G_REG_EVERY == 0:
        fake_img, latents = generator(torch.randn(max(1, BATCH // PATH_BATCH_SHRINK), LATENT, generator=gen),
                                      return_latents=True)
        path_loss, mean_path_length, path_lengths = g_path_regularize(fake_img, latents, mean_path_length)
        generator.zero_grad()
        weighted_path_loss = PATH_REGULARIZE * G_REG_EVERY * path_loss
        weighted_path_loss += 0 * fake_img[0, 0, 0, 0]
        weighted_path_loss.backward()
        ref.step(weighted_path_loss, zoolib.total_norm(generator.parameters()), optimizer=0)
        g_optim.step()
        if mons:
            mons[0].log(loss=weighted_path_loss)

    accumulate(g_ema, generator, 0.5 ** (32 / (10 * 1000)))
    if i % 40 == 0:
        print(f"[{i}/{iters}] d: {d_loss.item()!r}; g: {g_loss.item()!r}; r1: {r1_loss.item()!r}; "
              f"path: {path_loss.item()!r}; mean path: {mean_path_length.item()!r}")

os.makedirs(out_dir, exist_ok=True)
path = os.path.join(out_dir, f"{iters:06d}.pt")
torch.save({"g": generator.state_dict(), "d": discriminator.state_dict(), "g_ema": g_ema.state_dict(),
            "g_optim": g_optim.state_dict(), "d_optim": d_optim.state_dict()}, path)
with torch.no_grad():
    sample, _ = g_ema(torch.randn(64, LATENT, generator=gen))
print("sample mean", sample.mean().item(), "std", sample.std().item())
ref.saved_file(path)
ref.finish(discriminator, generator, g_ema)
