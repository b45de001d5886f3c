"""Two training ranks that the script starts itself, as PyTorch's DDP tutorial does
(torch.multiprocessing.spawn, gloo on the loopback).  Usage: spawn_ddp.py STEPS [spawn|fork]
[fail|exit|abort]: 'fail' makes rank 1 raise at its third step, 'exit' makes each rank leave
by os._exit(0) at its end, 'abort' makes rank 1 abort in the interpreter's shutdown, after
its function returned."""
import atexit
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def train(rank, world, steps, port, fail, hard_exit=False, abort=False):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        if fail and rank == 1 and step == 2:
            raise ValueError("rank 1 cannot read its shard")
        x = torch.randn(32, 3, 32, 32, generator=gen)
        t = torch.randint(0, 10, (32,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print("final loss", loss.item(), flush=True)
    if hard_exit:
        os._exit(0)
    if abort and rank == 1:
        atexit.register(os.abort)
    dist.destroy_process_group()


if __name__ == "__main__":
    steps = int(sys.argv[1])
    method = sys.argv[2] if len(sys.argv) > 2 else "spawn"
    fail, hard_exit, abort = ("fail" in sys.argv[3:], "exit" in sys.argv[3:],
                              "abort" in sys.argv[3:])
    port = int(os.environ.get("MASTER_PORT", "29533"))
    if method == "spawn":
        mp.spawn(train, args=(2, steps, port, fail, hard_exit, abort), nprocs=2)
    else:
        mp.start_processes(train, args=(2, steps, port, fail, hard_exit, abort), nprocs=2,
                           start_method=method)
