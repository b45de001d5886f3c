"""A user's GRU over twelve time steps (a test script), written two ways: ``fused`` calls
``nn.GRU`` once (on a CPU the library loops over the steps), ``cells`` steps an
``nn.GRUCell`` in a Python loop.  The same arithmetic, dispatched from different places."""
import sys

import torch
from torch import nn

torch.manual_seed(0)
way = sys.argv[1]
steps, batch, width = 12, 4, 16
x, y = torch.randn(batch, steps, width), torch.randint(0, 3, (batch,))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(width, width, batch_first=True) if way == "fused" else \
            nn.GRUCell(width, width)
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        if way == "fused":
            out, _ = self.gru(x)
            last = out[:, -1]
        else:
            last = torch.zeros(x.shape[0], width)
            for t in range(x.shape[1]):
                last = self.gru(x[:, t], last)
        return self.head(last)


net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
