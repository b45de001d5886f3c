"""A graph convolution over a sparse adjacency (a ring of nodes and itself, COO), its own loop."""
import sys

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
nodes, features, hidden, classes = 500, 16, 32, 4
torch.manual_seed(3)
ring = torch.arange(nodes)
src = torch.cat([ring, ring, (ring + 1) % nodes])
dst = torch.cat([ring, (ring + 1) % nodes, ring])
adj = torch.sparse_coo_tensor(torch.stack([src, dst]), torch.full((3 * nodes,), 1 / 3),
                              (nodes, nodes)).coalesce()
x, y = torch.randn(nodes, features), torch.randint(0, classes, (nodes,))


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(features, hidden), nn.Linear(hidden, classes)

    def forward(self, a, h):
        return torch.sparse.mm(a, self.second(torch.relu(torch.sparse.mm(a, self.first(h)))))


net = GCN()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for i in range(steps):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(net(adj, x), y)
    loss.backward()
    optimizer.step()
    print(f"{i} {loss.item():.6f}")
