"""A small character-level transformer language model, written as a user would write it."""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--seq", type=int, default=64)
parser.add_argument("--dim", type=int, default=64)
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--seed", type=int, default=1)
args = parser.parse_args()

torch.manual_seed(args.seed)
text = ("the quick brown fox jumps over the lazy dog while the cat sleeps in the sun " * 50)
vocab = sorted(set(text))
data = torch.tensor([vocab.index(c) for c in text])


class Block(nn.Module):
    def __init__(self, dim, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, n_vocab, dim, layers, seq):
        super().__init__()
        self.tok = nn.Embedding(n_vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, n_vocab)

    def forward(self, idx):
        return self.head(self.blocks(self.tok(idx) + self.pos[: idx.shape[1]]))


model = TinyLM(len(vocab), args.dim, args.layers, args.seq)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(1, args.steps + 1):
    starts = torch.randint(0, len(data) - args.seq - 1, (args.batch,))
    x = torch.stack([data[s:s + args.seq] for s in starts])
    y = torch.stack([data[s + 1:s + args.seq + 1] for s in starts])
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.6f} ppl {math.exp(loss.item()):.3f}")
