"""Family: a fastText-style text classifier (a large embedding table averaged per document, a small dense head), in Keras."""
import keras
from keras import layers

from _keras_common import BATCHES, arguments, rng, train

a = arguments(__doc__, batch=256, vocab=200000, length=64)
model = keras.Sequential([keras.Input((a.length,), dtype="int32"),
                          layers.Embedding(a.vocab, 128), layers.GlobalAveragePooling1D(),
                          layers.Dense(128, activation="relu"), layers.Dense(20)])
n = BATCHES * a.batch_size
tokens = rng().integers(0, a.vocab, (n, a.length)).astype("int32")
labels = rng().integers(0, 20, n)
train(model, tokens, labels, a.steps, a.lr, a.batch_size)
