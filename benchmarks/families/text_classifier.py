"""Family: a fastText-style text classifier (a large embedding table averaged per document, a small dense head)."""
import torch
from torch import nn

from _common import arguments, train


class Classifier(nn.Module):
    def __init__(self, vocab, dim, classes):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, classes))

    def forward(self, tokens):
        return self.head(self.embed(tokens))


a = arguments(__doc__, batch=256, vocab=200000, length=64)
model = Classifier(a.vocab, 128, 20)
data = [(torch.randint(0, a.vocab, (a.batch_size, a.length)),
         torch.randint(0, 20, (a.batch_size,))) for _ in range(4)]
train(model, data, nn.functional.cross_entropy, a.steps, a.lr)
