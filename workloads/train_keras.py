"""Keras 3 side of a training run (TensorFlow or JAX backend, from KERAS_BACKEND)."""
from __future__ import annotations

import os

import numpy as np

from .options import RunConfig


def _threads(cfg: RunConfig) -> None:
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if not cfg.onednn:
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    if backend == "tensorflow":
        import tensorflow as tf
        if cfg.threads:
            tf.config.threading.set_intra_op_parallelism_threads(cfg.threads)
            tf.config.threading.set_inter_op_parallelism_threads(
                int(os.environ.get("TF_NUM_INTEROP_THREADS", "2")))


def build(name: str, classes: int, image_size: int):
    import keras
    from keras import layers

    if name == "mnist-cnn":
        return keras.Sequential([
            keras.Input((28, 28, 1)),
            layers.Conv2D(32, 3, activation="relu"), layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(2), layers.Dropout(0.25), layers.Flatten(),
            layers.Dense(128, activation="relu"), layers.Dropout(0.5),
            layers.Dense(classes, activation="softmax")])
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=(image_size, image_size, 3),
                                           classes=classes)
    raise ValueError(f"model {name!r} is not available for keras (use mnist-cnn or resnet50)")


def setup(cfg: RunConfig, classes: int):
    _threads(cfg)
    import keras

    keras.utils.set_random_seed(cfg.seed)
    if cfg.precision == "bf16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = build(cfg.model, classes, cfg.image_size)
    params = int(sum(np.prod(w.shape) for w in model.trainable_weights))
    opt = keras.optimizers.Adam(1e-3) if cfg.model == "mnist-cnn" else \
        keras.optimizers.SGD(0.05, momentum=0.9)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy",
                  jit_compile=cfg.compile == "xla")

    def nhwc(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1))

    def step(x: np.ndarray, y: np.ndarray) -> float:
        out = model.train_on_batch(nhwc(x), y)
        return float(out[0] if isinstance(out, (list, tuple)) else out)

    def evaluate(x: np.ndarray, y: np.ndarray) -> float:
        pred = model.predict(nhwc(x), batch_size=1000, verbose=0).argmax(axis=1)
        return float((pred == y).mean())

    versions = {"keras": keras.__version__, "keras_backend": keras.backend.backend()}
    try:
        import tensorflow as tf
        versions["tensorflow"] = tf.__version__
    except ImportError:
        pass
    return step, evaluate, params, versions
