"""An LBFGS sequence model in float64, in the shape of the PyTorch examples'
``time_sequence_prediction/train.py``: two ``LSTMCell``s and a linear head learn sine
waves, ``model.double()``, ``optim.LBFGS`` with a closure that zeroes, runs forward and
backward and returns the loss; a test loss and a prediction of the future after each step.

The reference, per optimizer step: the loss ``step()`` returns (the closure's first
evaluation) and the gradient norm of that first evaluation.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import numpy as np
import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
hidden = 12


class Sequence(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, input: torch.Tensor, future: int = 0) -> torch.Tensor:
        outputs = []
        h_t = torch.zeros(input.size(0), hidden, dtype=torch.double)
        c_t = torch.zeros(input.size(0), hidden, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), hidden, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), hidden, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


# generate_sine_wave.py's data, smaller: 20 waves of 40 points
np.random.seed(2)
T, L, N = 20, 40, 20
x = np.empty((N, L), "int64")
x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
data = np.sin(x / 1.0 / T).astype("float64")

torch.manual_seed(0)
input = torch.from_numpy(data[3:, :-1])
target = torch.from_numpy(data[3:, 1:])
test_input = torch.from_numpy(data[:3, :-1])
test_target = torch.from_numpy(data[:3, 1:])
seq = Sequence()
seq.double()
criterion = nn.MSELoss()
optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(seq, optimizer)

for i in range(steps):
    print("STEP:", i)
    evaluations = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        out = seq(input)
        loss = criterion(out, target)
        print("loss:", repr(loss.item()))
        loss.backward()
        if not evaluations:
            evaluations.append(zoolib.total_norm(seq.parameters()))
        return loss

    loss = optimizer.step(closure)
    ref.step(loss, evaluations[0])
    if mon is not None:
        mon.log(loss=loss)
    with torch.no_grad():
        future = 10
        pred = seq(test_input, future=future)
        test_loss = criterion(pred[:, :-future], test_target)
        print("test loss:", repr(test_loss.item()))

os.makedirs(out_dir, exist_ok=True)
torch.save(seq.state_dict(), os.path.join(out_dir, "seq.pt"))
ref.saved_file(os.path.join(out_dir, "seq.pt"))
if mon is not None:
    mon.close()
ref.finish(seq)
