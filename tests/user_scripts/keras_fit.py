"""A Keras 3 classifier trained with model.fit, written as a user would write it
(``--models N``: N fresh models fitted one after another, a sweep's way; ``--jit``: the
script compiles its model with XLA itself)."""
import argparse

import numpy as np
import keras
from keras import layers

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=512)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--models", type=int, default=1)
parser.add_argument("--jit", action="store_true")
args = parser.parse_args()

keras.utils.set_random_seed(7)
rng = np.random.default_rng(7)
x = rng.normal(size=(args.samples, 16, 16, 1)).astype("float32")
y = (x.mean(axis=(1, 2, 3)) > 0).astype("int64")

for _ in range(args.models):
    model = keras.Sequential([
        keras.Input((16, 16, 1)),
        layers.Conv2D(8, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(32, activation="relu"),
        layers.Dense(2, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], **({"jit_compile": True} if args.jit else {}))
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=2)
    print("final loss %.6f" % history.history["loss"][-1])
