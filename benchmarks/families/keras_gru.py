"""Family: a recurrent sequence classifier (two-layer GRU), in Keras."""
import keras
from keras import layers

from _keras_common import BATCHES, arguments, rng, train

a = arguments(__doc__, batch=32, length=64, hidden=256)
model = keras.Sequential([keras.Input((a.length, 32)),
                          layers.GRU(a.hidden, return_sequences=True), layers.GRU(a.hidden),
                          layers.Dense(10)])
n = BATCHES * a.batch_size
x = rng().standard_normal((n, a.length, 32), dtype="float32")
y = rng().integers(0, 10, n)
train(model, x, y, a.steps, a.lr, a.batch_size)
