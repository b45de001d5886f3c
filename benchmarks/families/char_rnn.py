"""Family: a character-level language model with its LSTM cell stepped in a Python loop (many small operations a step)."""
import torch
from torch import nn

from _common import arguments, train


class CharRNN(nn.Module):
    def __init__(self, vocab, dim, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.cell = nn.LSTMCell(dim, hidden)
        self.head = nn.Linear(hidden, vocab)
        self.hidden = hidden

    def forward(self, tokens):
        x = self.embed(tokens)
        h = x.new_zeros(tokens.shape[0], self.hidden)
        c = x.new_zeros(tokens.shape[0], self.hidden)
        outputs = []
        for t in range(tokens.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
            outputs.append(h)
        return self.head(torch.stack(outputs, dim=1))


a = arguments(__doc__, batch=32, length=48, hidden=256)
vocab = 96
model = CharRNN(vocab, 64, a.hidden)
tokens = torch.randint(0, vocab, (4, a.batch_size, a.length + 1))
data = [(t[:, :-1], t[:, 1:]) for t in tokens]
train(model, data, lambda out, y: nn.functional.cross_entropy(out.reshape(-1, vocab),
                                                               y.reshape(-1)),
      a.steps, a.lr)
