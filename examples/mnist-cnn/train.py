"""A data scientist's own MNIST training script (the seed paper's CNN), nothing MODAK-specific.

    python3 train.py --steps 300 --batch-size 128
    python3 train.py --data DIR     # a folder with MNIST's IDX files (*-images-idx3-ubyte.gz)

Without --data it trains on random images of MNIST's shape (no data set is downloaded).
"""
import argparse
import gzip
import pathlib
import struct

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--data", default=None)
args = parser.parse_args()
torch.manual_seed(0)


def read_idx(path):
    raw = gzip.open(path).read()
    dims = raw[3]
    shape = struct.unpack(">" + "I" * dims, raw[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(raw[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


if args.data:
    folder = pathlib.Path(args.data)
    split = "train" if (folder / "train-images-idx3-ubyte.gz").exists() else "t10k"
    images = read_idx(folder / f"{split}-images-idx3-ubyte.gz").float().div(255).unsqueeze(1)
    labels = read_idx(folder / f"{split}-labels-idx1-ubyte.gz").long()
else:
    images, labels = torch.randn(args.batch_size * 8, 1, 28, 28), torch.randint(0, 10, (1024,))
    labels = labels[: len(images)]

model = nn.Sequential(
    nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
    nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5),
    nn.Linear(128, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
loss_fn = nn.CrossEntropyLoss()

step = 0
while step < args.steps:
    order = torch.randperm(len(images))
    for i in range(0, len(images) - args.batch_size + 1, args.batch_size):
        idx = order[i:i + args.batch_size]
        optimizer.zero_grad()
        loss = loss_fn(model(images[idx]), labels[idx])
        loss.backward()
        optimizer.step()
        step += 1
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
        if step == args.steps:
            break
print(f"done: {step} steps, last loss {loss.item():.4f}")
