"""Family: a 1-D convolutional network for signals (audio-like, residual-free, batch norm)."""
import torch
from torch import nn

from _common import arguments, train


def block(cin, cout, kernel, stride):
    return nn.Sequential(nn.Conv1d(cin, cout, kernel, stride=stride, padding=kernel // 2),
                         nn.BatchNorm1d(cout), nn.ReLU())


a = arguments(__doc__, batch=16, length=4000)
model = nn.Sequential(block(1, 32, 80, 4), nn.MaxPool1d(4), block(32, 64, 9, 1),
                      block(64, 64, 9, 1), nn.MaxPool1d(4), block(64, 128, 9, 1),
                      block(128, 128, 9, 1), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                      nn.Linear(128, 35))
data = [(torch.randn(a.batch_size, 1, a.length), torch.randint(0, 35, (a.batch_size,)))
        for _ in range(4)]
train(model, data, nn.functional.cross_entropy, a.steps, a.lr)
