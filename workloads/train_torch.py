"""PyTorch side of a training run: build the model, return step and evaluation functions."""
from __future__ import annotations

import contextlib

import numpy as np

from .options import RunConfig


def setup(cfg: RunConfig, classes: int):
    import torch

    from .torch_models import build, trainable_parameters

    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.backends.mkldnn.enabled = cfg.onednn
    model = build(cfg.model, classes)
    params = trainable_parameters(model)
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    if cfg.model == "mnist-cnn":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    compiled = model
    if cfg.compile != "off":
        compiled = torch.compile(model, mode=None if cfg.compile == "default" else cfg.compile)

    def autocast():
        if cfg.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def to_tensor(x: np.ndarray):
        t = torch.from_numpy(x)
        return t.contiguous(memory_format=fmt) if t.dim() == 4 else t

    def step(x: np.ndarray, y: np.ndarray) -> float:
        compiled.train()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(compiled(to_tensor(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        return float(loss.item())

    def evaluate(x: np.ndarray, y: np.ndarray) -> float:
        model.eval()
        correct = 0
        with torch.no_grad(), autocast():
            for i in range(0, len(x), 1000):
                pred = model(to_tensor(x[i:i + 1000])).argmax(dim=1).numpy()
                correct += int((pred == y[i:i + 1000]).sum())
        return correct / len(x)

    return step, evaluate, params, {"torch": torch.__version__}
