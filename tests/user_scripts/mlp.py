"""A plain PyTorch MLP regression with its own loop, written as a user would write it."""
import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
torch.manual_seed(3)
x = torch.randn(256, 32)
w_true = torch.randn(32, 1)
y = x @ w_true + 0.1 * torch.randn(256, 1)

net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
for i in range(steps):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    optimizer.step()
    print(f"{i} {loss.item():.8f}")
