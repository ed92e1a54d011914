"""MetricsCB on 2 CPU processes (torchrun, gloo), for tests/test_dist_metrics.py:

    torchrun --standalone --nproc_per_node 2 dist_metrics_run.py OUT CASE

CASE 'ddp' (DistributedDataParallel), 'fsdp' (FSDPCB, each Linear a shard) or 'accel' (AccelerateCB, which gathers the validation
predictions itself): a small MLP classifies 64 training and 36 validation samples, each process its half (a `DistributedSampler`, or
Accelerate's sharding: 8 samples a batch, 8, 8 and 2 in validation), 2 epochs, with MetricsCB: a torcheval accuracy and a torcheval
count of the samples seen (also on the training pass), a torchmetrics accuracy, and a metric of the user's own that cannot be merged.
CASE 'resume': DDP with CheckpointCB every 3 steps (file checkpoints, written by rank 0), 2 epochs of 4 steps; then a new trainer
resumes the checkpoint of step 6, in the middle of epoch 1's training pass; each process writes both histories ('history', 'resumed'). Each process
writes OUT/result_<rank>.json: the per-epoch history it recorded and the warnings. `data`, `make_model` and `metrics` also make the
single-process reference of the test (the same samples, 16 a batch).
"""
import datetime, json, sys, types, warnings
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
import torchmetrics
from torcheval.metrics import Metric, MulticlassAccuracy
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.sharding import FSDPCB

class Hits:
    "A metric of the user's own: the number of right answers, with no way to merge two of them"
    def __init__(self): self.reset()
    def update(self, preds, targets): self.n += int((preds.argmax(-1) == targets).sum())
    def compute(self): return self.n
    def reset(self): self.n = 0

class Seen(Metric):
    "The number of samples seen: a torcheval metric of our own, merged by adding"
    def __init__(self, device=None):
        super().__init__(device=device)
        self._add_state('n', torch.tensor(0., device=self.device))
    def update(self, preds, targets): self.n += len(targets); return self
    def compute(self): return self.n
    def merge_state(self, metrics):
        for m in metrics: self.n += m.n.to(self.device)
        return self

def data():
    "64 training and 36 validation samples of 8 features, 4 classes"
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 8, generator=g), torch.randint(0, 4, (100,), generator=g)
    return TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])

def loaders(world=1, bs=16):
    "A global batch of `bs` samples; on `world` processes each takes every `world`-th sample, `bs // world` a batch"
    ds, vds = data()
    if world == 1: return types.SimpleNamespace(train=DataLoader(ds, bs), valid=DataLoader(vds, bs))
    return types.SimpleNamespace(train=DataLoader(ds, bs // world, sampler=DistributedSampler(ds, shuffle=False)),
                                 valid=DataLoader(vds, bs // world, sampler=DistributedSampler(vds, shuffle=False)))

def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

def metrics():
    return MetricsCB(acc=MulticlassAccuracy(), seen=Seen(), tm=torchmetrics.Accuracy(task='multiclass', num_classes=4), train_metrics=True, show=False)

def records(trainer):
    "The per-epoch values the trainer's history holds, by name"
    h = trainer.history
    return {n: h.get_metric_values(n) for n in h.metric_names}

def run_resume(out):
    "The uninterrupted DDP fit with checkpoints, and the fit resumed from the middle of epoch 1: their histories"
    from aisaac.callbacks.savers import CheckpointCB
    res = {}
    for name, resume in (('history', None), ('resumed', out/'ckpt'/'checkpoint_0001_000002.pt')):
        model = nn.parallel.DistributedDataParallel(make_model())
        cbs = [BasicTrainCB(), metrics(), *([CheckpointCB(out/'ckpt', every='3 steps', every_n_epochs=None, keep_last=None)] if resume is None else [])]
        t = Trainer(loaders(2), nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=cbs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            t.fit(2, lr=0.1, resume_from=resume)
        res[name], res[f'{name}_warnings'] = records(t), [str(w.message) for w in caught if 'MetricsCB' in str(w.message)]
    return res

if __name__ == '__main__':
    out, case = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    if case == 'resume':
        (out/f'result_{dist.get_rank()}.json').write_text(json.dumps(run_resume(out)))
        dist.destroy_process_group(); sys.exit()
    model, m = make_model(), metrics()
    m.metrics['hits'] = Hits()
    if case == 'ddp': model, cbs = nn.parallel.DistributedDataParallel(model), [BasicTrainCB()]
    elif case == 'fsdp': cbs = [BasicTrainCB(), FSDPCB(min_params=50)]
    else:
        from aisaac.callbacks.accel import AccelerateCB
        cbs = [AccelerateCB()]
    t = Trainer(loaders(2) if case != 'accel' else loaders(1, 8), nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[*cbs, m])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        t.fit(2, lr=0.1)
    res = {'rank': dist.get_rank(), 'history': records(t), 'warnings': [str(w.message) for w in caught if 'MetricsCB' in str(w.message)]}
    (out/f'result_{dist.get_rank()}.json').write_text(json.dumps(res))
    dist.destroy_process_group()
