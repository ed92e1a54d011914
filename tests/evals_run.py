"""Evaluation sets on 2 CPU processes (torchrun, gloo), for tests/test_evals.py:

    torchrun --standalone --nproc_per_node 2 evals_run.py OUT CASE

CASE 'ddp': a small MLP (DistributedDataParallel) classifies 96 training samples, validated on 32 (`dls.valid`), on a set `a` of 32 samples
every epoch and a set `b` of 16 every 2 epochs (its own accuracy), each process its half of each (a `DistributedSampler`, 8 samples
a batch), 4 epochs. `run(1)` is the single-process reference, 16 samples a batch. Then a second fit, with a set `c` evaluated every
60 samples, where rank 0's batches hold 12 samples and rank 1's 4: the processes count samples differently, and follow rank 0.
Each process writes OUT/result_<rank>.json: its per-epoch history, the steps of `c` and its clock's samples.
CASE 'accel': AccelerateCB, with a set `again` holding dls.valid's samples, prepared by the callback's accelerator: each process
writes its history."""
import datetime, json, sys, types
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torcheval.metrics import MulticlassAccuracy
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.evals import EvalSetsCB, Eval

def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long() + 2 * (x[:, 2] > 0).long())

def loader(ds, world, bs=16):
    "A global batch of `bs` samples; on `world` processes each takes every `world`-th sample, `bs // world` a batch"
    return DataLoader(ds, bs) if world == 1 else DataLoader(ds, bs // world, sampler=DistributedSampler(ds, shuffle=False))

def model(world):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return m if world == 1 else nn.parallel.DistributedDataParallel(m)

def records(t):
    h = t.history
    return {n: {'steps': h.get_metric_steps(n), 'values': h.get_metric_values(n)} for n in h.metric_names}

def run(world):
    "The 4-epoch fit with sets a and b on `world` processes: its per-epoch history"
    dls = types.SimpleNamespace(train=loader(data(96, 0), world), valid=loader(data(32, 1), world))
    sets = EvalSetsCB(a=loader(data(32, 2), world), b=Eval(loader(data(16, 3), world), every=2, metrics={'acc': MulticlassAccuracy()}))
    t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, model(world),
                callbacks=[BasicTrainCB(), MetricsCB(acc=MulticlassAccuracy(), show=False), sets])
    t.fit(4, lr=0.2)
    return records(t)

def run_samples(rank):
    "A fit whose set `c` is due every 60 samples, where this process's batches hold 12 samples (rank 0) or 4 (rank 1): the steps of c"
    x = data(64, 4)
    own = TensorDataset(*x[:48]) if rank == 0 else TensorDataset(*x[48:])
    dls = types.SimpleNamespace(train=DataLoader(own, 12 if rank == 0 else 4), valid=loader(data(32, 1), 2))
    t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, model(2),
                callbacks=[BasicTrainCB(), MetricsCB(show=False), EvalSetsCB(c=Eval(loader(data(16, 3), 2), every='60 samples'))])
    t.fit(4, lr=0.2)
    return t.history.get_metric_steps('c/valid_loss'), t.clock.samples

def run_accel():
    "AccelerateCB on the 2 processes: a set `again` that is dls.valid's data, a loader prepared by the callback's accelerator (unsharded loaders)"
    from aisaac.callbacks.accel import AccelerateCB
    acc = AccelerateCB()
    dls = types.SimpleNamespace(train=DataLoader(data(96, 0), 8), valid=DataLoader(data(32, 1), 8))
    t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, model(1),
                callbacks=[acc, MetricsCB(acc=MulticlassAccuracy(), show=False), EvalSetsCB(again=acc.acc.prepare(DataLoader(data(32, 1), 8)))])
    t.fit(2, lr=0.2)
    return records(t)

if __name__ == '__main__':
    out, case = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    rank = dist.get_rank()
    if case == 'accel':
        (out/f'result_{rank}.json').write_text(json.dumps({'history': run_accel()}))
        dist.destroy_process_group(); sys.exit()
    history = run(2)
    c_steps, c_samples = run_samples(rank)
    (out/f'result_{rank}.json').write_text(json.dumps({'history': history, 'c_steps': c_steps, 'c_samples': c_samples}))
    dist.destroy_process_group()
