"""A user's script that trains on data from the cluster's shared file system, named by its
own argument (not by any MODAK variable), as most scripts are written: a linear classifier on
tensors saved in that directory, optionally from weights saved in another (``--init``).  It
says whether it could write there too."""
import argparse
import os

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--init", help="a directory elsewhere with the starting weights (w.pt)")
args = parser.parse_args()

x = torch.load(os.path.join(args.data, "x.pt"))
y = torch.load(os.path.join(args.data, "y.pt"))
try:
    with open(os.path.join(args.data, "written-by-the-job"), "w"):
        pass
    print("the data: writable", flush=True)
except OSError as exc:
    print(f"the data: not writable ({exc.strerror})", flush=True)
model = torch.nn.Linear(x.shape[1], int(y.max()) + 1)
if args.init:
    with torch.no_grad():
        model.weight.copy_(torch.load(os.path.join(args.init, "w.pt")))
    print(f"started from the weights in {args.init}", flush=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    i = (step * 16) % len(x)
    loss = torch.nn.functional.cross_entropy(model(x[i:i + 16]), y[i:i + 16])
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"trained {args.steps} steps on {len(x)} samples; loss {loss.item():.4f}", flush=True)
