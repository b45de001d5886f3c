"""Family: a ConvNeXt-style CNN (depthwise 7x7 convolutions, LayerNorm, a GELU MLP per pixel)."""
import torch
from torch import nn

from _common import arguments, train


class ChannelNorm(nn.Module):
    """LayerNorm over the channels of an NCHW tensor."""

    def __init__(self, channels):
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.dw(x).permute(0, 2, 3, 1)
        return x + self.mlp(self.norm(h)).permute(0, 3, 1, 2)


a = arguments(__doc__, batch=16, image_size=64)
dims, depths = [48, 96, 192], [2, 2, 4]
layers = [nn.Conv2d(3, dims[0], 4, stride=4), ChannelNorm(dims[0])]
for i, (dim, depth) in enumerate(zip(dims, depths)):
    if i:
        layers += [ChannelNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, stride=2)]
    layers += [Block(dim) for _ in range(depth)]
model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(dims[-1]),
                      nn.Linear(dims[-1], 100))
data = [(torch.randn(a.batch_size, 3, a.image_size, a.image_size),
         torch.randint(0, 100, (a.batch_size,))) for _ in range(2)]
train(model, data, nn.functional.cross_entropy, a.steps, a.lr)
