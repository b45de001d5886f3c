"""What the family scripts share: arguments, a fixed seed, the training loop.

Each family is an ordinary PyTorch script (its model, its synthetic data, its loop); this
module only keeps them short.  The data are fixed by the seed, so that the
losses of two configurations of one family can be compared (a knob that changes the
result must show it).  Like most users' scripts, they train on the GPU when the job has
one (``torch.cuda.is_available()``), else on the CPU: the data are drawn on the CPU either
way, so both devices see the same batches."""
import torch
from _args import parse


def arguments(description, batch=32, steps=30, **extra):
    a = parse(description, batch, steps, **extra)
    torch.manual_seed(0)
    return a


def to_device(value, device):
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    return value.to(device)


def train(model, batches, loss_fn, steps, lr):
    """``batches``: a list of (input, target) cycled through for ``steps`` steps."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    batches = [to_device(b, device) for b in batches]
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
