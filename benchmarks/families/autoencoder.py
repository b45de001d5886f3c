"""Family: a denoising dense autoencoder (an MLP encoder and decoder with batch norm, a reconstruction loss)."""
import torch
from torch import nn

from _common import arguments, train


def dense(cin, cout):
    return nn.Sequential(nn.Linear(cin, cout), nn.BatchNorm1d(cout), nn.ReLU())


a = arguments(__doc__, batch=128, features=2048, code=64)
model = nn.Sequential(dense(a.features, 512), dense(512, 256), nn.Linear(256, a.code),
                      dense(a.code, 256), dense(256, 512), nn.Linear(512, a.features))
clean = torch.randn(4, a.batch_size, a.features)
data = [(x + 0.1 * torch.randn_like(x), x) for x in clean]
train(model, data, nn.functional.mse_loss, a.steps, a.lr)
