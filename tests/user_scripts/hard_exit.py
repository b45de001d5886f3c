"""Trains a small MLP, prints its last loss and leaves with os._exit, as scripts do to skip
a slow teardown (data-loader workers, a process group).  Usage: hard_exit.py STEPS [CODE]"""
import os
import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters(), 1e-3)
for step in range(int(sys.argv[1])):
    x, t = torch.randn(64, 64), torch.randint(0, 10, (64,))
    loss = nn.functional.cross_entropy(model(x), t)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("final loss", loss.item())
sys.stdout.flush()
os._exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
