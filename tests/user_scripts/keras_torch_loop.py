"""A Keras 3 regressor trained by a loop of its own on the torch backend, as Keras' guide
"writing a training loop from scratch in PyTorch" has it: the loss's backward(), then the
optimizer's apply."""
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

keras.utils.set_random_seed(3)
rng = np.random.default_rng(3)
x = torch.tensor(rng.normal(size=(256, 16)), dtype=torch.float32)
y = torch.tensor(np.sin(x.numpy()[:, :4].sum(axis=1, keepdims=True)), dtype=torch.float32)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(1)])
optimizer = keras.optimizers.Adam(1e-3)
loss_fn = keras.losses.MeanSquaredError()

for epoch in range(2):
    for i in range(0, len(x), 32):
        logits = model(x[i:i + 32], training=True)
        loss = loss_fn(y[i:i + 32], logits)
        model.zero_grad()
        loss.backward()
        weights = model.trainable_weights
        with torch.no_grad():
            optimizer.apply([w.value.grad for w in weights], weights)
    print("epoch %d loss %.6f" % (epoch, float(loss)))
