"""A small CNN trained under DistributedDataParallel (gloo), as a cluster user writes it: it
runs under torchrun, or plain as a single process (rank 0 of 1)."""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                    nn.Flatten(), nn.Linear(32, 10))
model = DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))
for step in range(steps):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0:
        print(f"{step} {loss.item():.6f}")
dist.destroy_process_group()
