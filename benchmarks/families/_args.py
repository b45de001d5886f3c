"""The family scripts' command line, shared by the PyTorch and the Keras ones (imports no
framework: a Keras script must not import torch, whose import the runtime watches)."""
import argparse


def parse(description, batch=32, steps=30, **extra):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--batch-size", type=int, default=batch)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--lr", type=float, default=0.01)
    for name, default in extra.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    return ap.parse_args()
