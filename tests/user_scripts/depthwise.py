"""A plain PyTorch CNN with a depthwise-separable block (MobileNet-like), its own loop."""
import sys

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
torch.manual_seed(5)
net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                    nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(),  # depthwise
                    nn.Conv2d(8, 16, 1), nn.ReLU(),                       # pointwise
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
for i in range(steps):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    optimizer.step()
    print(f"{i} {loss.item():.6f}")
