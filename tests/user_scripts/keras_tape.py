"""A Keras 3 classifier trained by a loop of its own (GradientTape, apply_gradients), as a
user writes it on TensorFlow: the step a tf.function (default) or eager (--eager), its
batches sliced from arrays (default) or taken from a tf.data dataset (--dataset)."""
import argparse

import numpy as np
import keras
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--eager", action="store_true")
parser.add_argument("--fit-after", action="store_true", help="then one epoch of model.fit")
parser.add_argument("--dataset", action="store_true",
                    help="batches from a tf.data dataset, and a validation pass each epoch")
args = parser.parse_args()

keras.utils.set_random_seed(5)
rng = np.random.default_rng(5)
x = rng.normal(size=(256, 20)).astype("float32")
y = (x[:, :3].sum(axis=1) > 0).astype("int32")
model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(2)])
optimizer = keras.optimizers.Adam(1e-3)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return {"loss": loss}


step = train_step if args.eager else tf.function(train_step)
train = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
val = tf.data.Dataset.from_tensor_slices((x[:64], y[:64])).batch(32)
for epoch in range(args.epochs):
    if args.dataset:
        for xb, yb in train:
            out = step(xb, yb)
        for xb, yb in val:
            model(xb, training=False)
    else:
        for i in range(0, len(x), 32):
            out = step(x[i:i + 32], y[i:i + 32])
    print("epoch %d loss %.6f" % (epoch, float(out["loss"])))
if args.fit_after:
    model.compile(optimizer="adam", loss=loss_fn)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
