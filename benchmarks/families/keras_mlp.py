"""Family: the wide multi-layer perceptron (tabular or flattened inputs), in Keras."""
import keras
from keras import layers

from _keras_common import BATCHES, arguments, rng, train

a = arguments(__doc__, batch=256, width=1024)
model = keras.Sequential([keras.Input((784,)), layers.Dense(a.width, activation="relu"),
                          layers.Dense(a.width, activation="relu"),
                          layers.Dense(a.width, activation="relu"), layers.Dense(10)])
n = BATCHES * a.batch_size
x = rng().standard_normal((n, 784), dtype="float32")
y = rng().integers(0, 10, n)
train(model, x, y, a.steps, a.lr, a.batch_size)
