"""Family: an LSTM language model (embedding, two LSTM layers, a tied-size output layer)."""
import torch
from torch import nn

from _common import arguments, train


class LSTMLM(nn.Module):
    def __init__(self, vocab, dim, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


a = arguments(__doc__, batch=16, length=48, dim=128, hidden=256)
vocab = 4000
model = LSTMLM(vocab, a.dim, a.hidden)
tokens = torch.randint(0, vocab, (4, a.batch_size, a.length + 1))
data = [(t[:, :-1], t[:, 1:]) for t in tokens]
train(model, data, lambda out, y: nn.functional.cross_entropy(out.reshape(-1, vocab),
                                                               y.reshape(-1)),
      a.steps, a.lr)
