"""Family: a small vision transformer (patch embedding, encoder blocks, class token)."""
import torch
from torch import nn

from _common import arguments, train


class ViT(nn.Module):
    def __init__(self, image, patch, dim, layers, heads, classes):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.patches(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        return self.head(self.norm(self.body(h)[:, 0]))


a = arguments(__doc__, batch=16, image_size=64, patch=8, dim=192, layers=4)
model = ViT(a.image_size, a.patch, a.dim, a.layers, 3, 100)
data = [(torch.randn(a.batch_size, 3, a.image_size, a.image_size),
         torch.randint(0, 100, (a.batch_size,))) for _ in range(4)]
train(model, data, nn.functional.cross_entropy, a.steps, a.lr)
