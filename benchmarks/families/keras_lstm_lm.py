"""Family: the LSTM language model (embedding, two LSTM layers, an output layer), in Keras."""
import keras
from keras import layers

from _keras_common import BATCHES, arguments, rng, train

a = arguments(__doc__, batch=16, length=48, dim=128, hidden=256)
vocab = 4000
model = keras.Sequential([keras.Input((a.length,), dtype="int32"),
                          layers.Embedding(vocab, a.dim),
                          layers.LSTM(a.hidden, return_sequences=True),
                          layers.LSTM(a.hidden, return_sequences=True), layers.Dense(vocab)])
n = BATCHES * a.batch_size
tokens = rng().integers(0, vocab, (n, a.length + 1)).astype("int32")
train(model, tokens[:, :-1], tokens[:, 1:], a.steps, a.lr, a.batch_size)
