"""What the Keras family scripts share: arguments, a fixed seed, the data, ``fit``.

Each Keras family is an ordinary Keras 3 script (its model, its synthetic data, one call of
``Model.fit``), the same architecture as the PyTorch family of the same name: the campaign
measures it under that family's name with its framework ``keras``, so a family held out
is held out in both frameworks.  The data are drawn once with a fixed seed (16 batches,
cycled through by the epochs), so that two configurations' losses can be compared."""
import numpy as np
from _args import parse

BATCHES = 16  # batches of data, each epoch one pass over them


def arguments(description, batch=32, steps=32, **extra):
    a = parse(description, batch, steps, **extra)
    import keras
    keras.utils.set_random_seed(0)
    return a


def rng():
    return np.random.default_rng(0)


def train(model, x, y, steps, lr, batch_size, loss=None):
    """``x``, ``y``: BATCHES batches of data, fitted for ``steps`` optimizer steps (whole
    epochs over them, at least one) with SGD and momentum, as the PyTorch families;
    ``loss``: a Keras loss, by default cross-entropy on integer labels and logits."""
    import keras
    model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9),
                  loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    epochs = max(1, -(-steps // BATCHES))
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=2)
    return history.history["loss"][-1]
