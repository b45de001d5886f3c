"""A plain PyTorch model whose forward takes its batch as one (dense, ids) tuple, as
recommenders and multi-input models often do."""
import sys

import torch
from torch import nn


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(100, 8, mode="sum")
        self.dense = nn.Linear(5, 8)
        self.head = nn.Linear(16, 1)

    def forward(self, batch):
        dense, ids = batch
        return self.head(torch.cat([self.dense(dense), self.embed(ids)], dim=1)).squeeze(1)


steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
torch.manual_seed(0)
model = TwoInputs()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batch = (torch.randn(24, 5), torch.randint(0, 100, (24, 3)))
target = torch.rand(24)
for _ in range(steps):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(batch), target)
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.6f}")
