"""Family: a recommender (embedding tables for sparse features, dense MLPs: DLRM-like)."""
import torch
from torch import nn

from _common import arguments, train


class Recommender(nn.Module):
    def __init__(self, tables, rows, dim, dense):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum")
                                        for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense, 256), nn.ReLU(), nn.Linear(256, dim))
        self.top = nn.Sequential(nn.Linear(dim * (tables + 1), 512), nn.ReLU(),
                                 nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, batch):
        dense, sparse = batch
        parts = [self.bottom(dense)] + [e(sparse[:, i]) for i, e in enumerate(self.embeddings)]
        return self.top(torch.cat(parts, dim=1)).squeeze(1)


a = arguments(__doc__, batch=512, tables=8, rows=100000)
model = Recommender(a.tables, a.rows, 64, 13)
data = [((torch.randn(a.batch_size, 13), torch.randint(0, a.rows, (a.batch_size, a.tables, 4))),
         torch.randint(0, 2, (a.batch_size,)).float()) for _ in range(4)]
train(model, data, nn.functional.binary_cross_entropy_with_logits, a.steps, a.lr)
