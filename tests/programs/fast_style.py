"""Fast neural style transfer in the shape of pytorch/examples' ``fast_neural_style``
(``neural_style.py train``, after Johnson et al.): a ``TransformerNet`` (reflection-padded
convolutions, instance norm with affine weights, residual blocks, a nearest-neighbour
upsampling convolution) trained by Adam at 1e-3 against a frozen feature network (the
script's VGG16, here three small frozen convolution stages); content loss on one stage's
features times ``content_weight`` 1e5 and style loss on the Gram matrices of every stage
times ``style_weight`` 1e10, images in [0, 255] normalised with ImageNet's mean and std; the
transformer's state dict saved at the end.

The weights put the loss at 1.9e5 and the gradient norm between 3.7e4 and 5.9e4 for the
whole run, while Adam's updates stay small and the loss falls to 3.3e4 in 120 steps:
``GradientExplosion`` (an absolute ceiling of 1000) fired, a warning for the whole run,
before it knew that an adaptive optimizer's updates do not grow with the gradients' size.

The reference: per step, the total loss and the gradient norm.

argv: OUT_DIR [STEPS]
"""

import os
import sys

import torch
import zoolib
from torch import nn

out_dir = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 120
torch.manual_seed(42)
gen = torch.Generator().manual_seed(42)


class ConvLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.reflection_pad = nn.ReflectionPad2d(kernel_size // 2)
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2d(self.reflection_pad(x))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1, self.in1 = ConvLayer(channels, channels, 3, 1), nn.InstanceNorm2d(channels, affine=True)
        self.conv2, self.in2 = ConvLayer(channels, channels, 3, 1), nn.InstanceNorm2d(channels, affine=True)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.in2(self.conv2(self.relu(self.in1(self.conv1(x))))) + x


class UpsampleConvLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int, upsample: int) -> None:
        super().__init__()
        self.upsample = upsample
        self.reflection_pad = nn.ReflectionPad2d(kernel_size // 2)
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.interpolate(x, mode="nearest", scale_factor=self.upsample)
        return self.conv2d(self.reflection_pad(x))


class TransformerNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.in1 = ConvLayer(3, 8, 9, 1), nn.InstanceNorm2d(8, affine=True)
        self.conv2, self.in2 = ConvLayer(8, 16, 3, 2), nn.InstanceNorm2d(16, affine=True)
        self.res1, self.res2 = ResidualBlock(16), ResidualBlock(16)
        self.deconv1, self.in4 = UpsampleConvLayer(16, 8, 3, 1, upsample=2), nn.InstanceNorm2d(8, affine=True)
        self.deconv3 = ConvLayer(8, 3, 9, 1)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.in1(self.conv1(x)))
        y = self.relu(self.in2(self.conv2(y)))
        y = self.res2(self.res1(y))
        y = self.relu(self.in4(self.deconv1(y)))
        return self.deconv3(y)


class Features(nn.Module):
    """The frozen feature network (the script's ``Vgg16(requires_grad=False)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.slice1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                    nn.ReLU())
        self.slice2 = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())
        self.slice3 = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())
        for param in self.parameters():
            param.requires_grad = False

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h1 = self.slice1(x)
        h2 = self.slice2(h1)
        return [h1, h2, self.slice3(h2)]


def gram_matrix(y: torch.Tensor) -> torch.Tensor:
    b, ch, h, w = y.size()
    features = y.view(b, ch, w * h)
    return features.bmm(features.transpose(1, 2)) / (ch * h * w)


def normalize_batch(batch: torch.Tensor) -> torch.Tensor:
    mean = batch.new_tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)
    std = batch.new_tensor([0.229, 0.224, 0.225]).view(-1, 1, 1)
    return (batch / 255.0 - mean) / std


transformer = TransformerNet()
optimizer = torch.optim.Adam(transformer.parameters(), 1e-3)
mse_loss = nn.MSELoss()
vgg = Features()
batch_size, content_weight, style_weight = 4, 1e5, 1e10
style = torch.rand(1, 3, 32, 32, generator=gen).repeat(batch_size, 1, 1, 1) * 255
gram_style = [gram_matrix(y) for y in vgg(normalize_batch(style))]
ref = zoolib.Reference()
mon = None
if zoolib.watching():
    import sentinel

    mon = sentinel.watch(transformer, optimizer)
for batch_id in range(steps):
    x = torch.rand(batch_size, 3, 32, 32, generator=gen) * 255
    optimizer.zero_grad()
    y = normalize_batch(transformer(x))
    x = normalize_batch(x)
    features_y, features_x = vgg(y), vgg(x)
    content_loss = content_weight * mse_loss(features_y[1], features_x[1])
    style_loss = 0.0
    for ft_y, gm_s in zip(features_y, gram_style):
        style_loss = style_loss + mse_loss(gram_matrix(ft_y), gm_s[:batch_size, :, :])
    style_loss = style_loss * style_weight
    total_loss = content_loss + style_loss
    total_loss.backward()
    ref.step(total_loss, zoolib.total_norm(transformer.parameters()))
    optimizer.step()
    if mon is not None:
        mon.log(loss=total_loss)
    if batch_id % 30 == 0:
        print(f"step {batch_id} content {content_loss.item()!r} style {style_loss.item()!r}")

os.makedirs(out_dir, exist_ok=True)
path = os.path.join(out_dir, "transformer.model")
torch.save(transformer.state_dict(), path)
ref.saved_file(path)
if mon is not None:
    mon.close()
ref.finish(transformer)
