"""Family: the small CNN (two convolutions, MNIST-sized images), in Keras."""
import keras
from keras import layers

from _keras_common import BATCHES, arguments, rng, train

a = arguments(__doc__, batch=64)
model = keras.Sequential([keras.Input((28, 28, 1)), layers.Conv2D(32, 3, activation="relu"),
                          layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(2),
                          layers.Flatten(), layers.Dense(128, activation="relu"),
                          layers.Dense(10)])
n = BATCHES * a.batch_size
x = rng().standard_normal((n, 28, 28, 1), dtype="float32")
y = rng().integers(0, 10, n)
train(model, x, y, a.steps, a.lr, a.batch_size)
