"""Reader of the MNIST IDX files (plain or gzip), with numpy only."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class IdxError(ValueError):
    pass


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file: magic 0x0000TTDD (TT type, DD number of dimensions)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        head = f.read(4)
        if len(head) != 4 or head[:2] != b"\0\0":
            raise IdxError(f"{path}: not an IDX file (bad magic {head!r})")
        dtype, ndim = head[2], head[3]
        if dtype not in _DTYPES or ndim == 0:
            raise IdxError(f"{path}: unsupported IDX type 0x{dtype:02x} with {ndim} dimensions")
        dims = struct.unpack(f">{ndim}I", f.read(4 * ndim))
        data = f.read()
    dt = np.dtype(_DTYPES[dtype])
    expected = int(np.prod(dims)) * dt.itemsize
    if len(data) != expected:
        raise IdxError(f"{path}: {len(data)} data bytes, header {dims} needs {expected}")
    return np.frombuffer(data, dtype=dt).reshape(dims)


def _find(folder: Path, split: str, kind: str) -> Path:
    ndim = 3 if kind == "images" else 1
    for sep in ("-", "."):
        for suffix in (".gz", ""):
            p = folder / f"{split}-{kind}{sep}idx{ndim}-ubyte{suffix}"
            if p.exists():
                return p
    raise FileNotFoundError(f"{folder}: no {split} {kind} IDX file "
                            f"({split}-{kind}-idx{ndim}-ubyte[.gz])")


def has_split(folder: str | Path, split: str) -> bool:
    try:
        _find(Path(folder), split, "images")
        return True
    except FileNotFoundError:
        return False


def load(folder: str | Path, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and labels (N,) uint8 of ``split`` ('train' or 't10k')."""
    folder = Path(folder)
    images = read_idx(_find(folder, split, "images"))
    labels = read_idx(_find(folder, split, "labels"))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise IdxError(f"{folder}: {split} images {images.shape} and labels {labels.shape} "
                       "do not pair up")
    if labels.size and labels.max() > 9:
        raise IdxError(f"{folder}: {split} labels outside 0-9")
    return images, labels
