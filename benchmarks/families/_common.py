"""What the family scripts share: arguments, a fixed seed, the training loop.

Each family is an ordinary PyTorch script (its model, its synthetic data, its loop); this
module only keeps them short.  The data are fixed by the seed, so that the
losses of two configurations of one family can be compared (a knob that changes the
result must show it)."""
import argparse

import torch


def arguments(description, batch=32, steps=30, **extra):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--batch-size", type=int, default=batch)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--lr", type=float, default=0.01)
    for name, default in extra.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    a = ap.parse_args()
    torch.manual_seed(0)
    return a


def train(model, batches, loss_fn, steps, lr):
    """``batches``: a list of (input, target) cycled through for ``steps`` steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    loss = None
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
    return loss.item() if loss is not None else None
