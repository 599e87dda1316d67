"""Knowledge distillation in one script, shaped like PyTorch's knowledge distillation
tutorial: a deep teacher trained first with its own Adam, then a light student trained on
the teacher's softened outputs (temperature T, the soft targets' loss × T², weighted 0.25)
and the hard labels (0.75), the teacher in eval mode under no_grad.

argv: [NAN_AT]: from the student's step NAN_AT, anomaly detection on and a NaN in the
loss, so that its ``backward()`` raises ("Function 'LogBackward0' returned nan values").
"""

import sys

import torch
import torch.nn.functional as F
from torch import nn

nan_at = int(sys.argv[1]) if len(sys.argv) > 1 else 0
torch.manual_seed(0)
X = torch.randn(1024, 32)
Y = (X @ torch.randn(32, 10) + 0.5 * torch.randn(1024, 10)).argmax(1)
teacher = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
student = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 10))


def batches():
    perm = torch.randperm(len(X))
    for i in range(0, len(X), 64):
        idx = perm[i:i + 64]
        yield X[idx], Y[idx]


def train(model, epochs):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for epoch in range(epochs):
        for x, y in batches():
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"teacher epoch {epoch} loss {loss.item()!r}")


def train_knowledge_distillation(teacher, student, epochs, T=2.0, soft_target_loss_weight=0.25, ce_loss_weight=0.75):
    optimizer = torch.optim.Adam(student.parameters(), lr=3e-3)
    teacher.eval()
    student.train()
    step = 0
    for epoch in range(epochs):
        for x, y in batches():
            optimizer.zero_grad()
            with torch.no_grad():
                teacher_logits = teacher(x)
            student_logits = student(x)
            soft_targets = F.softmax(teacher_logits / T, dim=-1)
            soft_prob = F.log_softmax(student_logits / T, dim=-1)
            soft_targets_loss = torch.sum(soft_targets * (soft_targets.log() - soft_prob)) / soft_prob.size()[0] * (T ** 2)
            label_loss = F.cross_entropy(student_logits, y)
            loss = soft_target_loss_weight * soft_targets_loss + ce_loss_weight * label_loss
            step += 1
            if nan_at and step >= nan_at:
                torch.autograd.set_detect_anomaly(True)
                loss = loss * torch.log(torch.tensor(-1.0))
            loss.backward()
            optimizer.step()
        print(f"student epoch {epoch} loss {loss.item()!r}")


train(teacher, 3)
train_knowledge_distillation(teacher, student, 4)
with torch.no_grad():
    print(f"student accuracy {(student(X).argmax(1) == Y).float().mean().item()!r}")
