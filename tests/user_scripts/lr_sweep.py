"""A learning-rate sweep, written as a user would write it: one fresh model and optimizer
per rate (and hidden width, 128 unless given), each trained in turn, the best one kept.
Each model says, at its end, the dtype its first layer computed in at its last step
(bfloat16 under an autocast, else float32) and whether it was compiled.

    python lr_sweep.py STEPS_PER_MODEL [RATE[:WIDTH] ...]
"""
import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
runs = [(float(r.partition(":")[0]), int(r.partition(":")[2] or 128))
        for r in sys.argv[2:]] or [(0.3, 128), (0.1, 128), (0.03, 128)]
torch.manual_seed(5)
x = torch.randn(512, 64)
y = (x[:, :8].sum(dim=1) > 0).long()


class Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.first = torch.nn.Linear(64, width)
        self.out = torch.nn.Linear(width, 2)
        self.dtype_seen = None

    def forward(self, inputs):
        hidden = self.first(inputs)
        self.dtype_seen = str(hidden.dtype).replace("torch.", "")
        return self.out(torch.relu(hidden))


results = {}
for rate, width in runs:
    net = Net(width)
    opt = torch.optim.SGD(net.parameters(), lr=rate, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
    results[(rate, width)] = loss.item()
    compiled = getattr(net, "_compiled_call_impl", None) is not None
    print(f"rate {rate} width {width} loss {loss.item():.6f} {net.dtype_seen} "
          f"{'compiled' if compiled else 'eager'}", flush=True)
print(f"best {min(results, key=results.get)}")
