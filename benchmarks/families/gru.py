"""Family: a recurrent sequence classifier (two-layer GRU)."""
import torch
from torch import nn

from _common import arguments, train


class GRUClassifier(nn.Module):
    def __init__(self, features, hidden, classes):
        super().__init__()
        self.rnn = nn.GRU(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


a = arguments(__doc__, batch=32, length=64, hidden=256)
model = GRUClassifier(32, a.hidden, 10)
data = [(torch.randn(a.batch_size, a.length, 32), torch.randint(0, 10, (a.batch_size,)))
        for _ in range(4)]
train(model, data, nn.functional.cross_entropy, a.steps, a.lr)
