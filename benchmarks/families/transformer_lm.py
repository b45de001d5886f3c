"""Family: a small transformer language model (causal self-attention)."""
import torch
from torch import nn

from _common import arguments, train


class LM(nn.Module):
    def __init__(self, vocab, dim, layers, heads, length):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, length, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(length))

    def forward(self, tokens):
        h = self.body(self.embed(tokens) + self.pos, mask=self.mask, is_causal=True)
        return self.head(h)


a = arguments(__doc__, batch=16, length=128, dim=256, layers=4)
vocab = 2000
model = LM(vocab, a.dim, a.layers, 4, a.length)
tokens = torch.randint(0, vocab, (4, a.batch_size, a.length + 1))
data = [(t[:, :-1], t[:, 1:]) for t in tokens]
train(model, data, lambda out, y: nn.functional.cross_entropy(out.reshape(-1, vocab),
                                                               y.reshape(-1)),
      a.steps, a.lr)
