"""A VAE in the shape of the PyTorch examples' ``vae/main.py`` (encoder to ``mu, logvar``,
the reparameterisation trick, a decoder, one Adam, the loss summed over a batch's dimensions
and its KL term), with a continuous Gaussian likelihood whose variance the decoder learns
(as VAEs on real-valued data do) instead of the example's Bernoulli one on MNIST.

The data: 8-dimensional points on a 2-dimensional linear manifold with a little noise
(standard deviation 0.05). The negative ELBO starts positive and goes well below 0 as the
decoder's variance shrinks to the noise: a Gaussian's density above 1 has a negative
log-likelihood, so a falling loss crosses zero and keeps falling. That is a healthy fit.

The reference: per optimizer step, the loss (the batch's mean negative ELBO) and the
gradient norm.

argv: OUT_DIR [EPOCHS]
"""

import math
import os
import sys

import torch
import zoolib
from torch import nn
from torch.nn import functional as F

out_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 20
dim, latent, hidden, batch_size, n = 8, 2, 32, 64, 1536
torch.manual_seed(3)
gen = torch.Generator().manual_seed(3)
mixing = 0.5 * torch.randn(latent, dim, generator=gen)
data = torch.randn(n, latent, generator=gen) @ mixing + 0.05 * torch.randn(n, dim, generator=gen)


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc21 = nn.Linear(hidden, latent)
        self.fc22 = nn.Linear(hidden, latent)
        self.fc3 = nn.Linear(latent, hidden)
        self.fc4 = nn.Linear(hidden, dim)
        self.dec_logvar = nn.Parameter(torch.zeros(dim))  # the likelihood's log-variance, per dimension

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        std = torch.exp(0.5 * logvar)
        eps = torch.randn(std.shape, generator=gen)
        return mu + eps * std

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc4(F.relu(self.fc3(z)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.encode(x)
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor,
                  dec_logvar: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # -log N(x; recon_x, exp(dec_logvar)), summed over the dimensions, mean over the batch
    nll = 0.5 * (dec_logvar + (x - recon_x) ** 2 / dec_logvar.exp() + math.log(2 * math.pi))
    nll = nll.sum(dim=1).mean()
    # see Appendix B of Kingma & Welling, Auto-Encoding Variational Bayes
    kld = (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(dim=1)).mean()
    return nll + kld, nll, kld


model = VAE()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

for epoch in range(1, epochs + 1):
    model.train()
    train_loss = 0.0
    perm = torch.randperm(n, generator=gen)
    for batch_idx, start in enumerate(range(0, n, batch_size)):
        x = data[perm[start:start + batch_size]]
        optimizer.zero_grad()
        recon, mu, logvar = model(x)
        loss, nll, kld = loss_function(recon, x, mu, logvar, model.dec_logvar)
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.parameters()))
        optimizer.step()
        if mon is not None:
            mon.log(loss=loss)
        train_loss += loss.item() * len(x)
        print(f"epoch {epoch} batch {batch_idx} loss {loss.item()!r} nll {nll.item()!r} kld {kld.item()!r}")
    print(f"====> Epoch: {epoch} Average loss: {train_loss / n!r}")

os.makedirs(out_dir, exist_ok=True)
torch.save(model.state_dict(), os.path.join(out_dir, "vae.pt"))
ref.saved_file(os.path.join(out_dir, "vae.pt"))
if mon is not None:
    mon.close()
ref.finish(model)
