"""Family: a small U-Net for segmentation (conv blocks, pooling down, transposed convolutions up, skip connections)."""
import torch
from torch import nn

from _common import arguments, train


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    def __init__(self, width, classes):
        super().__init__()
        w = [width, 2 * width, 4 * width]
        self.down = nn.ModuleList([block(3, w[0]), block(w[0], w[1])])
        self.middle = block(w[1], w[2])
        self.up = nn.ModuleList([nn.ConvTranspose2d(w[2], w[1], 2, stride=2),
                                 nn.ConvTranspose2d(w[1], w[0], 2, stride=2)])
        self.merge = nn.ModuleList([block(2 * w[1], w[1]), block(2 * w[0], w[0])])
        self.out = nn.Conv2d(w[0], classes, 1)

    def forward(self, x):
        skips = []
        for down in self.down:
            x = down(x)
            skips.append(x)
            x = nn.functional.max_pool2d(x, 2)
        x = self.middle(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips)):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.out(x)


a = arguments(__doc__, batch=4, image_size=64, width=16)
model = UNet(a.width, 5)
data = [(torch.randn(a.batch_size, 3, a.image_size, a.image_size),
         torch.randint(0, 5, (a.batch_size, a.image_size, a.image_size))) for _ in range(2)]
train(model, data, nn.functional.cross_entropy, a.steps, a.lr)
