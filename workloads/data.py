"""Training batches as numpy arrays: synthetic of the right shape, or real MNIST."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from . import mnist


def input_shape(model: str, image_size: int) -> tuple[int, int, int]:
    return (1, 28, 28) if model == "mnist-cnn" else (3, image_size, image_size)


def classes(model: str) -> int:
    return 10 if model == "mnist-cnn" else 1000


def normalise(images: np.ndarray) -> np.ndarray:
    return ((images.astype(np.float32) / 255.0) - 0.1307) / 0.3081


def real_mnist(folder: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], str]:
    """(train, test, note). A folder with only the test split trains and evaluates on it."""
    test = mnist.load(folder, "t10k") if mnist.has_split(folder, "t10k") else None
    if mnist.has_split(folder, "train"):
        train, note = mnist.load(folder, "train"), "train/t10k"
    elif test is not None:
        train, note = test, "t10k only (evaluated on the data it trained on)"
    else:
        raise FileNotFoundError(f"{folder}: no MNIST IDX files")
    return train, (test if test is not None else train), note


def batches(images: np.ndarray, labels: np.ndarray, batch: int, rng: np.random.Generator,
            epochs: int | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Shuffled batches (N, 1, 28, 28) float32, for ``epochs`` epochs or forever."""
    x = normalise(images)[:, None, :, :]
    y = labels.astype(np.int64)
    epoch = 0
    while epochs is None or epoch < epochs:
        order = rng.permutation(len(x))
        for i in range(0, len(order) - batch + 1 if len(order) >= batch else 1, batch):
            idx = order[i:i + batch]
            yield x[idx], y[idx]
        epoch += 1


def synthetic(model: str, image_size: int, batch: int, rng: np.random.Generator):
    shape = input_shape(model, image_size)
    x = rng.standard_normal((batch, *shape), dtype=np.float32)
    y = rng.integers(0, classes(model), size=batch).astype(np.int64)
    return x, y
