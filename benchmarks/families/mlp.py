"""Family: a wide multi-layer perceptron (tabular or flattened inputs)."""
import torch
from torch import nn

from _common import arguments, train

a = arguments(__doc__, batch=256, width=1024)
model = nn.Sequential(nn.Linear(784, a.width), nn.ReLU(), nn.Linear(a.width, a.width),
                      nn.ReLU(), nn.Linear(a.width, a.width), nn.ReLU(),
                      nn.Linear(a.width, 10))
data = [(torch.randn(a.batch_size, 784), torch.randint(0, 10, (a.batch_size,)))
        for _ in range(4)]
train(model, data, nn.functional.cross_entropy, a.steps, a.lr)
