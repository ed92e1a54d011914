#!/usr/bin/env python
"""The cost of the agreements of a distributed fit (`aisaac.ranks`), on 2 CPU processes (torchrun, gloo, DistributedDataParallel):

    torchrun --standalone --nproc_per_node 2 bench/ranks.py

Prints the time of one agreement alone (an all-reduce of 3 integers on a gloo group of its own), and the time per training
batch of fits of a small MLP (Linear(20, 64), ReLU, Linear(64, 10); batch 32; 4,096 rows, so 64 batches per process) with the
agreements and without them (`trainer.ranks_agree = False`), interleaved, the median of 7 repeats each. A training batch has one
agreement (at the end of `before_step`), a validation batch one (at the end of `before_dataloader`).
"""
import statistics, time, types
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB

def fit_time(agree, dls, model):
    trainer = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[BasicTrainCB()])
    trainer.ranks_agree = agree
    dist.barrier()
    start = time.perf_counter()
    trainer.fit(1, lr=0.01, valid=False)
    return (time.perf_counter() - start) / len(dls.train)

if __name__ == '__main__':
    dist.init_process_group('gloo')
    torch.set_num_threads(1)
    rank, g = dist.get_rank(), dist.new_group(backend='gloo')
    for _ in range(100): dist.all_reduce(torch.tensor([0, 1, -1]), dist.ReduceOp.MAX, group=g)
    n, start = 2000, time.perf_counter()
    for _ in range(n): dist.all_reduce(torch.tensor([0, 1, -1]), dist.ReduceOp.MAX, group=g)
    one = (time.perf_counter() - start) / n
    x, y = torch.randn(4096, 20), torch.randint(0, 10, (4096,))
    ds = TensorDataset(x, y)
    dls = types.SimpleNamespace(train=DataLoader(ds, 32, sampler=DistributedSampler(ds)), valid=None)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10)))
    times = {True: [], False: []}
    fit_time(True, dls, model); fit_time(False, dls, model)  # warm up
    for _ in range(7):
        for agree in (False, True): times[agree].append(fit_time(agree, dls, model))
    if rank == 0:
        with_, without = statistics.median(times[True]), statistics.median(times[False])
        print(f"one agreement: {one*1e6:.0f} us")
        print(f"per training batch: {without*1e6:.0f} us without the agreements, {with_*1e6:.0f} us with them "
              f"(+{(with_ - without)*1e6:.0f} us, {with_ / without - 1:+.1%})")
    dist.destroy_process_group()
