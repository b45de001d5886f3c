"""Family: a small CNN (two convolutions, MNIST-sized images)."""
import torch
from torch import nn

from _common import arguments, train

a = arguments(__doc__, batch=64)
model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 12 * 12, 128), nn.ReLU(),
                      nn.Linear(128, 10))
data = [(torch.randn(a.batch_size, 1, 28, 28), torch.randint(0, 10, (a.batch_size,)))
        for _ in range(4)]
train(model, data, nn.functional.cross_entropy, a.steps, a.lr)
