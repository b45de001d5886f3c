"""Family: a mobile-style CNN (MobileNetV2 inverted residuals, depthwise convolutions)."""
import torch
from torch import nn

from _common import arguments, train


class Inverted(nn.Module):
    def __init__(self, cin, cout, stride, expand=6):
        super().__init__()
        mid = cin * expand
        self.use_skip = stride == 1 and cin == cout
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
            nn.ReLU6(), nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.body(x) if self.use_skip else self.body(x)


a = arguments(__doc__, batch=32, image_size=64)
spec = [(16, 24, 2), (24, 24, 1), (24, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1),
        (64, 96, 1), (96, 160, 2), (160, 320, 1)]
model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
                      *[Inverted(i, o, s) for i, o, s in spec],
                      nn.Conv2d(320, 640, 1, bias=False), nn.BatchNorm2d(640), nn.ReLU6(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(640, 100))
data = [(torch.randn(a.batch_size, 3, a.image_size, a.image_size),
         torch.randint(0, 100, (a.batch_size,))) for _ in range(2)]
train(model, data, nn.functional.cross_entropy, a.steps, a.lr)
