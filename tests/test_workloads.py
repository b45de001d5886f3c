"""Reference workloads: parameter counts, the IDX loader on real bytes, short real runs."""
import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, need

from workloads import mnist
from modak_lib.results import parse_fom_lines as parse_lines

SAMPLE = ROOT / "workloads/data/mnist-sample"


# ---------------------------------------------------------------------------
# the loader, on real MNIST bytes
def test_idx_loader_reads_the_real_sample():
    images, labels = mnist.load(SAMPLE, "t10k")
    assert images.shape == (500, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (500,)
    # the first ten test labels of MNIST, known by heart to anyone who printed them
    assert labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert set(labels.tolist()) == set(range(10))
    assert images.max() == 255 and images[0, :4].sum() == 0  # black border
    assert not mnist.has_split(SAMPLE, "train")


def _write(path: Path, raw: bytes):
    with gzip.open(path, "wb") as f:
        f.write(raw)


def test_idx_loader_rejects_truncated_and_bad_files(tmp_path):
    raw = gzip.open(SAMPLE / "t10k-images-idx3-ubyte.gz").read()
    _write(tmp_path / "t10k-images-idx3-ubyte.gz", raw[:-10])
    with pytest.raises(mnist.IdxError, match="data bytes"):
        mnist.read_idx(tmp_path / "t10k-images-idx3-ubyte.gz")
    _write(tmp_path / "bad.gz", b"PK\x03\x04" + raw[4:])
    with pytest.raises(mnist.IdxError, match="not an IDX file"):
        mnist.read_idx(tmp_path / "bad.gz")
    (tmp_path / "plain-idx1-ubyte").write_bytes(b"\0\0\x08\x01\0\0\0\x02\x01\x02")
    assert mnist.read_idx(tmp_path / "plain-idx1-ubyte").tolist() == [1, 2]  # uncompressed
    with pytest.raises(FileNotFoundError, match="no train images"):
        mnist.load(tmp_path, "train")


# ---------------------------------------------------------------------------
# parameter counts: the paper's MNIST-CNN has 1,199,882 in every framework
def test_torch_parameter_counts():
    need("torch")
    from workloads.torch_models import build, trainable_parameters
    assert trainable_parameters(build("mnist-cnn")) == 1_199_882
    assert trainable_parameters(build("resnet50")) == 25_557_032  # torchvision's resnet50
    assert trainable_parameters(build("resnet18")) == 11_689_512  # torchvision's resnet18


def test_keras_parameter_counts():
    need("keras")
    need("tensorflow")
    from workloads.train_keras import build
    model = build("mnist-cnn", 10, 224)
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == 1_199_882
    resnet = build("resnet50", 1000, 64)
    assert sum(int(np.prod(w.shape)) for w in resnet.trainable_weights) == 25_583_592


# ---------------------------------------------------------------------------
# short real runs through the runtime, as a job script starts them
def train(*args, env=None, timeout=300, ok=True):
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "modak_runtime", "--",
                           str(ROOT / "workloads/train.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, env=full_env, timeout=timeout)
    (rec,) = parse_lines(proc.stdout)
    if not ok:
        assert proc.returncode != 0 and rec["status"] == "failed"
        return rec, proc
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert rec["status"] == "ok" and rec["schema"] == 2
    m = rec["metrics"]
    for key in ("s_per_step", "steps_per_s", "samples_per_s", "peak_rss_mb", "final_loss",
                "warmup_s", "wall_s"):
        assert isinstance(m[key], float) and np.isfinite(m[key]), key
    assert m["steps_per_s"] > 0 and m["peak_rss_mb"] > 10
    assert rec["host"]["cores"] >= 1 and rec["host"]["cpu_model"]
    return rec, proc


@pytest.mark.parametrize("args", [
    ["--model", "mnist-cnn", "--steps", "5"],
    ["--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--steps", "2"],
    ["--model", "resnet50", "--image-size", "32", "--batch-size", "2", "--steps", "1",
     "--warmup", "1"],
])
def test_pytorch_runs_are_measured_by_the_runtime(args):
    need("torch")
    rec, _ = train(*args)
    assert rec["framework"] == "pytorch" and rec["config"]["compiler"] == "off"
    warmup = int(args[args.index("--warmup") + 1]) if "--warmup" in args else 3
    assert rec["metrics"]["steps"] == warmup + int(args[args.index("--steps") + 1])
    assert rec["applied"] == {} and rec["not_applied"] == {}  # nothing asked, nothing done


def test_keras_runs_are_measured_by_the_runtime():
    need("keras")
    need("tensorflow")
    rec, _ = train("--framework", "keras", "--model", "mnist-cnn", "--steps", "3",
                   env={"KERAS_BACKEND": "tensorflow"})
    assert rec["framework"] == "keras" and rec["effect"]["keras_backend"] == "tensorflow"
    assert rec["fingerprint"]["trainable_parameters"] == 1_199_882
    rec, _ = train("--framework", "keras", "--model", "resnet50", "--image-size", "32",
                   "--batch-size", "2", "--steps", "1", "--warmup", "1",
                   env={"MODAK_WORKLOAD": "resnet50"})
    assert rec["workload"] == "resnet50"
    assert rec["fingerprint"]["trainable_parameters"] == 25_583_592


def test_modak_environment_is_applied_by_the_runtime():
    need("torch")
    rec, _ = train("--steps", "2", env={"MODAK_THREADS": "1", "MODAK_PRECISION": "bf16",
                                        "MODAK_ALLOCATOR": "glibc"})
    assert rec["config"]["threads"] == 1 and rec["config"]["precision"] == "bf16"
    assert rec["effect"]["threads"] == 1 and rec["effect"]["matmul_dtype"] == "bfloat16"
    assert "precision" in rec["applied"]


def test_torch_compile_path():
    need("torch")
    rec, _ = train("--steps", "3", "--warmup", "1", env={"MODAK_TORCH_COMPILE": "default"})
    assert rec["config"]["compiler"] == "torch.compile:default"
    assert rec["effect"]["compiled"] is True and rec["metrics"]["warmup_s"] > 0


def test_real_data_training_reports_accuracy():
    need("torch")
    rec, proc = train("--data", str(SAMPLE), "--epochs", "3", "--batch-size", "50")
    assert rec["metrics"]["steps"] == 30  # 500 images / 50 per batch x 3 epochs
    accuracy = float(proc.stdout.split("test accuracy ")[1].split()[0])
    assert 0.5 < accuracy <= 1.0  # it learns even from 500 digits
    assert "t10k only" in proc.stdout


def test_a_failing_run_is_recorded_as_failed():
    rec, proc = train("--model", "mnist-cnn", "--data", "/nonexistent", ok=False)
    assert rec["error"]["knob"] is None and "nonexistent" in rec["error"]["message"]
    assert "Traceback" in proc.stderr  # the script's own traceback, as python would print it
