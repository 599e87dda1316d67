"""A script that sets up Python's logging as the Hugging Face example scripts and many
research repositories do: ``logging.basicConfig`` with a handler to stdout and one to a
``train.log`` in its output folder, the root logger at INFO, its progress through
``logger.info``; and an optimizer made anew for each stage of training, as scripts that
set a stage's learning rate that way do. The zoo compares its stdout and its
``train.log`` (line by line) with the plain run's.

argv: OUT_DIR [STEPS_PER_STAGE]
"""

import logging
import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
os.makedirs(out_dir, exist_ok=True)
log_file = os.path.join(out_dir, "train.log")
logging.basicConfig(format="%(levelname)s - %(name)s - %(message)s", level=logging.INFO,
                    handlers=[logging.StreamHandler(sys.stdout), logging.FileHandler(log_file)])
logger = logging.getLogger(__name__)

torch.manual_seed(4)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
ref = zoolib.Reference()
gen = torch.Generator().manual_seed(4)
for stage, lr in enumerate((1e-2, 3e-3, 1e-3)):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    logger.info("stage %d: AdamW at lr %s", stage, lr)
    for step in range(steps):
        x = torch.randn(32, 6, generator=gen)
        y = x[:, :1] - 0.5 * x[:, 1:2]
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        ref.step(loss, zoolib.total_norm(model.parameters()))
        optimizer.step()
        logger.info("stage %d step %d loss %r", stage, step, loss.item())
torch.save(model.state_dict(), os.path.join(out_dir, "model.pt"))
ref.saved_file(os.path.join(out_dir, "model.pt"))
ref.finish(model)
logging.shutdown()
