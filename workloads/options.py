"""Command-line options of a reference training run (an ordinary script's argparse options).

MODAK does not reach the run through these: its runtime (``python3 -m modak_runtime -- train.py``)
applies the plan's knobs to the unmodified script, as for any user's script.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass
from typing import Optional

MODELS = ("mnist-cnn", "resnet18", "resnet50")


@dataclass
class RunConfig:
    framework: str
    model: str
    steps: int
    warmup: int
    batch_size: int
    image_size: int
    data: str
    epochs: Optional[int]
    threads: Optional[int]
    compile: str  # off | default | reduce-overhead | max-autotune (pytorch); off | xla (keras)
    precision: str
    channels_last: bool
    onednn: bool
    seed: int
    eval: bool
    keras_backend: Optional[str]

    def as_dict(self) -> dict:
        return asdict(self)


def parse(argv=None) -> RunConfig:
    p = argparse.ArgumentParser(prog="train.py", description=__doc__)
    p.add_argument("--framework", choices=["pytorch", "keras"],
                   default="pytorch")
    p.add_argument("--model", choices=MODELS, default="mnist-cnn")
    p.add_argument("--steps", type=int, default=50, help="timed training steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--batch-size", type=int, default=None, help="default 128 (MNIST), 32")
    p.add_argument("--image-size", type=int, default=224, help="ResNet input size")
    p.add_argument("--data", default="synthetic",
                   help="'synthetic', or a folder with the MNIST IDX files")
    p.add_argument("--epochs", type=int, default=None,
                   help="with real data: train whole epochs instead of --steps")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--compile", default=None,
                   help="pytorch: off|default|reduce-overhead|max-autotune; keras: off|xla")
    p.add_argument("--precision", choices=["fp32", "bf16"],
                   default="fp32")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--onednn", choices=["on", "off"], default="on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval", action="store_true", help="report test accuracy (real data)")
    a = p.parse_args(argv)
    if a.compile is None:
        a.compile = "off"
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    batch = a.batch_size or (128 if a.model == "mnist-cnn" else 32)
    return RunConfig(framework=a.framework, model=a.model, steps=a.steps, warmup=a.warmup,
                     batch_size=batch, image_size=a.image_size, data=a.data, epochs=a.epochs,
                     threads=a.threads, compile=a.compile, precision=a.precision,
                     channels_last=a.channels_last, onednn=a.onednn == "on", seed=a.seed,
                     eval=a.eval, keras_backend=os.environ.get("KERAS_BACKEND"))
