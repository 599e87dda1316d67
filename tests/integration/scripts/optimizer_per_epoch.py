"""An optimizer made anew each epoch to set its learning rate (older tutorials' way of
decaying it), over the same model. No sentinel import. Prints each epoch's last loss."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
x = torch.randn(256, 16)
y = x[:, :4].sum(1, keepdim=True)
for epoch in range(4):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02 * 0.5 ** epoch)
    for i in range(0, 256, 32):
        loss = nn.functional.mse_loss(model(x[i:i + 32]), y[i:i + 32])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item()!r}")
