"""A user's LSTM sequence tagger (a test script): two LSTM layers, a linear head, Adam."""
import torch
from torch import nn

torch.manual_seed(0)
rnn = nn.LSTM(16, 32, num_layers=2, batch_first=True)
head = nn.Linear(32, 5)
opt = torch.optim.Adam(list(rnn.parameters()) + list(head.parameters()), lr=0.01)
x, y = torch.randn(4, 10, 16), torch.randint(0, 5, (4, 10))
for step in range(3):
    opt.zero_grad()
    out, _ = rnn(x)
    loss = nn.functional.cross_entropy(head(out).reshape(-1, 5), y.reshape(-1))
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
