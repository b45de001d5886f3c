"""Family: ResNet-18 or ResNet-50 (plain torch.nn), small images."""
import torch
from torch import nn

from _common import arguments, train


class Basic(nn.Module):
    expansion = 1

    def __init__(self, cin, c, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))
        self.skip = (nn.Sequential(nn.Conv2d(cin, c, 1, stride, bias=False), nn.BatchNorm2d(c))
                     if stride != 1 or cin != c else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, c, stride):
        super().__init__()
        out = c * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, out, 1, bias=False), nn.BatchNorm2d(out))
        self.skip = (nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False),
                                   nn.BatchNorm2d(out))
                     if stride != 1 or cin != out else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def resnet(depth, classes=100):
    block, counts = {18: (Basic, [2, 2, 2, 2]), 50: (Bottleneck, [3, 4, 6, 3])}[depth]
    layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                   nn.MaxPool2d(3, 2, 1)], 64
    for i, n in enumerate(counts):
        for j in range(n):
            layers.append(block(cin, 64 * 2 ** i, 2 if j == 0 and i > 0 else 1))
            cin = 64 * 2 ** i * block.expansion
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


a = arguments(__doc__, batch=16, steps=15, depth=18, image_size=64)
model = resnet(a.depth)
data = [(torch.randn(a.batch_size, 3, a.image_size, a.image_size),
         torch.randint(0, 100, (a.batch_size,))) for _ in range(2)]
train(model, data, nn.functional.cross_entropy, a.steps, a.lr)
