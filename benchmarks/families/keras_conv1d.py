"""Family: the 1-D convolutional network for signals (batch norm, no residuals), in Keras."""
import keras
from keras import layers

from _keras_common import BATCHES, arguments, rng, train


def block(filters, kernel, stride=1):
    return [layers.Conv1D(filters, kernel, strides=stride, padding="same"),
            layers.BatchNormalization(), layers.ReLU()]


a = arguments(__doc__, batch=16, length=4000)
model = keras.Sequential([keras.Input((a.length, 1)), *block(32, 80, 4), layers.MaxPooling1D(4),
                          *block(64, 9), *block(64, 9), layers.MaxPooling1D(4),
                          *block(128, 9), *block(128, 9), layers.GlobalAveragePooling1D(),
                          layers.Dense(35)])
n = BATCHES * a.batch_size
x = rng().standard_normal((n, a.length, 1), dtype="float32")
y = rng().integers(0, 35, n)
train(model, x, y, a.steps, a.lr, a.batch_size)
