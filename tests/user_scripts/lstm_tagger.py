"""A user's sequence tagger (a test script): a bidirectional LSTM over word ids, AdamW.
torch.compile finds nothing to compile in it here: the runtime reports the compiler as not
applied, which takes every compiled configuration out of the candidates."""
import argparse

import torch
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=600)
steps = ap.parse_args().steps
torch.manual_seed(1)


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.rnn = nn.Embedding(5000, 64), nn.LSTM(64, 128, bidirectional=True)
        self.out = nn.Linear(256, 17)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(h)


model = Tagger()
opt = torch.optim.AdamW(model.parameters(), 1e-3)
data = [(torch.randint(0, 5000, (40, 32)), torch.randint(0, 17, (40, 32))) for _ in range(8)]
for i in range(steps):
    x, y = data[i % 8]
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x).reshape(-1, 17), y.reshape(-1))
    loss.backward()
    opt.step()
    if i % 50 == 0:
        print(i, loss.item(), flush=True)
