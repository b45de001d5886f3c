"""A data-parallel script written for torchrun, which starts its ranks and hands each its
place in the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).  Usage:
torchrun_ddp.py STEPS [stall|fail|kill]: 'stall' makes every rank spend 60 s inside its
fourth step (as a compilation longer than a trial's time cap does), 'fail' makes rank 1
raise at its sixth step, 'kill' makes rank 0 end by SIGKILL there (as the kernel's
out-of-memory killer does)."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main():
    steps = int(sys.argv[1])
    how = sys.argv[2] if len(sys.argv) > 2 else ""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x = torch.randn(24, 64, generator=gen)
        t = torch.randint(0, 10, (24,), generator=gen)
        if how == "stall" and step == 3:
            time.sleep(60)
        if how == "fail" and rank == 1 and step == 5:
            raise ValueError("rank 1 cannot read its shard")
        if how == "kill" and rank == 0 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = nn.functional.cross_entropy(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print("final loss", loss.item(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
