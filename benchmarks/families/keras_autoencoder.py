"""Family: a denoising dense autoencoder (an MLP encoder and decoder with batch norm, a reconstruction loss), in Keras."""
import keras
from keras import layers

from _keras_common import BATCHES, arguments, rng, train


def dense(units):
    return [layers.Dense(units), layers.BatchNormalization(), layers.ReLU()]


a = arguments(__doc__, batch=128, features=2048, code=64)
model = keras.Sequential([keras.Input((a.features,)), *dense(512), *dense(256),
                          layers.Dense(a.code), *dense(256), *dense(512),
                          layers.Dense(a.features)])
n = BATCHES * a.batch_size
clean = rng().standard_normal((n, a.features), dtype="float32")
noisy = clean + 0.1 * rng().standard_normal((n, a.features), dtype="float32")
train(model, noisy, clean, a.steps, a.lr, a.batch_size, loss="mse")
