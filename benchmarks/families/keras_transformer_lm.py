"""Family: a small transformer language model (causal self-attention, pre-norm blocks), in Keras."""
import keras
from keras import layers

from _keras_common import BATCHES, arguments, rng, train


class Positions(layers.Layer):
    """A learned position embedding added to the tokens' (PyTorch's twin: a parameter)."""

    def build(self, shape):
        self.pos = self.add_weight(shape=(1, *shape[1:]), initializer="zeros")

    def call(self, x):
        return x + self.pos


def block(h, dim, heads):
    x = layers.LayerNormalization()(h)
    h = h + layers.MultiHeadAttention(heads, dim // heads)(x, x, use_causal_mask=True)
    x = layers.LayerNormalization()(h)
    return h + layers.Dense(dim)(layers.Dense(4 * dim, activation="relu")(x))


a = arguments(__doc__, batch=16, length=128, dim=256, layers=4)
vocab = 2000
tokens_in = keras.Input((a.length,), dtype="int32")
h = Positions()(layers.Embedding(vocab, a.dim)(tokens_in))
for _ in range(a.layers):
    h = block(h, a.dim, 4)
model = keras.Model(tokens_in, layers.Dense(vocab)(h))
n = BATCHES * a.batch_size
tokens = rng().integers(0, vocab, (n, a.length + 1)).astype("int32")
train(model, tokens[:, :-1], tokens[:, 1:], a.steps, a.lr, a.batch_size)
