"""Neural style transfer, in the shape of the PyTorch tutorial (``neural_style_tutorial.py``)
and its many copies: a frozen convolutional network (``requires_grad_(False)``, ``eval()``)
with content and style loss modules inserted after chosen layers, each keeping its loss in
an attribute during the forward; the *input image* is what is optimized (``LBFGS([input_img])``,
no module holds it), with a closure that clamps the image, zeroes, runs the network, weighs
the style loss by 1e6 and calls ``backward()``, and a counter kept in a list.

The reference, per optimizer step: the loss ``step()`` returns (the closure's first
evaluation: the weighted style plus content score) and that evaluation's gradient norm.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import torch.nn.functional as F
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 15  # the tutorial's 300 evaluations
torch.manual_seed(3)
size = 32


def gram_matrix(input: torch.Tensor) -> torch.Tensor:
    a, b, c, d = input.size()
    features = input.view(a * b, c * d)
    G = torch.mm(features, features.t())
    return G.div(a * b * c * d)


class ContentLoss(nn.Module):
    def __init__(self, target: torch.Tensor) -> None:
        super().__init__()
        self.target = target.detach()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self.loss = F.mse_loss(input, self.target)
        return input


class StyleLoss(nn.Module):
    def __init__(self, target_feature: torch.Tensor) -> None:
        super().__init__()
        self.target = gram_matrix(target_feature).detach()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self.loss = F.mse_loss(gram_matrix(input), self.target)
        return input


class Normalization(nn.Module):
    def __init__(self, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return (img - self.mean) / self.std


# a small VGG-like feature stack, random weights (the tutorial loads vgg19's features)
cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                    nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                    nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()).eval()
# stand-ins for the two photographs: stripes for the style, a smooth gradient for the content
yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
style_img = torch.stack([(torch.sin(xx * 25) + 1) / 2, (torch.sin(yy * 17) + 1) / 2, xx * yy]).unsqueeze(0)
content_img = (torch.stack([xx, yy, 1 - xx]) * 0.8 + 0.1 * torch.rand(3, size, size)).unsqueeze(0)
style_img, content_img = 0.25 + style_img / 2, 0.25 + content_img / 2  # mid-tones: the clamp rarely bites
content_layers, style_layers = ["conv_4"], ["conv_1", "conv_2", "conv_3", "conv_4"]

model = nn.Sequential(Normalization([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]))
content_losses, style_losses = [], []
i = 0
for layer in cnn.children():
    if isinstance(layer, nn.Conv2d):
        i += 1
        name = f"conv_{i}"
    elif isinstance(layer, nn.ReLU):
        name = f"relu_{i}"
        layer = nn.ReLU(inplace=False)
    else:
        name = f"pool_{i}"
    model.add_module(name, layer)
    if name in content_layers:
        content_loss = ContentLoss(model(content_img).detach())
        model.add_module(f"content_loss_{i}", content_loss)
        content_losses.append(content_loss)
    if name in style_layers:
        style_loss = StyleLoss(model(style_img).detach())
        model.add_module(f"style_loss_{i}", style_loss)
        style_losses.append(style_loss)

input_img = content_img.clone()
input_img.requires_grad_(True)
model.eval()
model.requires_grad_(False)
optimizer = torch.optim.LBFGS([input_img])
style_weight, content_weight = 1000000, 1
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(model, optimizer)

run = [0]
for step in range(steps):
    evaluations = []

    def closure() -> torch.Tensor:
        with torch.no_grad():
            input_img.clamp_(0, 1)
        optimizer.zero_grad()
        model(input_img)
        style_score = sum(sl.loss for sl in style_losses) * style_weight
        content_score = sum(cl.loss for cl in content_losses) * content_weight
        loss = style_score + content_score
        loss.backward()
        if not evaluations:
            evaluations.append(zoolib.total_norm([input_img]))
        run[0] += 1
        return style_score + content_score

    loss = optimizer.step(closure)
    ref.step(loss, evaluations[0])
    if mon is not None:
        mon.log(loss=loss)
    print(f"step {step} run {run[0]} loss {loss.item()!r}")

with torch.no_grad():
    input_img.clamp_(0, 1)
os.makedirs(out_dir, exist_ok=True)
torch.save(input_img.detach(), os.path.join(out_dir, "styled.pt"))
ref.saved_file(os.path.join(out_dir, "styled.pt"))
if mon is not None:
    mon.close()
ref.finish(nn.ParameterList([nn.Parameter(input_img.detach())]))
