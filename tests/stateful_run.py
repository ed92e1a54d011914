"""Two CPU processes (torchrun, gloo, DistributedDataParallel) whose training loaders are at different places, for tests/test_shards.py:

    torchrun --standalone --nproc_per_node 2 stateful_run.py OUT CASE

CASE 'stream': each process reads its own stream of rows (rank r from row 1000 r on) through an iterable dataset that says its state;
'shards': `ShardLoader`s over token shards, each process its share of every batch. Each process trains 2 epochs with a checkpoint
after every batch, then a fresh trainer resumes from the checkpoint after batch 3 of epoch 1. Each process writes OUT/result_<rank>.json:
the rows (or first tokens) of the training batches of both runs, the rows its resumed run read, its weights after each run.
"""
import datetime, json, sys, types
from pathlib import Path
import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.savers import CheckpointCB
from aisaac.shards import ShardLoader, TokenShards, write_token_shards

class Stream(IterableDataset):
    "Rows `(x, y)` numbered from `first`: 48 an epoch; its state is the number of the next row; `read` counts the rows it made"
    def __init__(self, first): self.first, self.next, self.start, self.read = first, 0, 0, 0
    def __iter__(self):
        self.next = self.start
        self.start = 0
        while self.next < 48:
            i, self.next = self.first + self.next, self.next + 1
            self.read += 1
            g = torch.Generator().manual_seed(i)
            x = torch.randn(4, generator=g)
            x[0] = i / 10_000
            yield x, x[1:2] * 2
    def state_dict(self): return {'row': self.first + self.next}  # (the row's number: each process's differs)
    def load_state_dict(self, s): self.start = s['row'] - self.first

class Seen(Callback):
    def __init__(self): self.batches = []
    def after_dataloader(self, t):
        if t.model.training: self.batches.append((t.batch[0][:, 0] * (10_000 if case == 'stream' else 1)).round().long().tolist())

class Model(nn.Module):
    "A linear model on rows, or on a block's first 4 ids"
    def __init__(self): super().__init__(); self.lin = nn.Linear(4, 1)
    def forward(self, x): return self.lin(x[:, :4].float() / 100)

def loader():
    if case == 'stream':
        ds = Stream(1000 * dist.get_rank())
        return DataLoader(ds, batch_size=4), ds
    return ShardLoader(TokenShards(out/'shards'), block_size=9, bs=2, shuffle=True, seed=0, tfm=lambda b: (b[0], b[0][:, -1:].float() / 100)), None

def run(resume=None):
    torch.manual_seed(0)
    dl, ds = loader()
    seen = Seen()
    cbs = [BasicTrainCB(), seen] + ([] if resume else [CheckpointCB(out/'ckpt', every_n_epochs=None, every_n_batches=1, keep_last=None)])
    t = Trainer(types.SimpleNamespace(train=dl, valid=[]), nn.MSELoss(), torch.optim.SGD, DistributedDataParallel(Model()), callbacks=cbs)
    t.fit(2, lr=0.1, valid=False, resume_from=resume)
    return seen.batches, [p.detach().flatten().tolist() for p in t.model.parameters()], ds and ds.read

if __name__ == '__main__':
    out, case = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    if case == 'shards' and rank == 0: write_token_shards([np.arange(600) % 500], out/"shards", vocab_size=500, shard_tokens=250)
    dist.barrier()
    whole, weights, _ = run()
    dist.barrier()
    resumed, rweights, read = run(out/'ckpt'/'checkpoint_0001_000003.pt')
    (out/f'result_{rank}.json').write_text(json.dumps({'whole': whole, 'resumed': resumed, 'weights': weights, 'rweights': rweights, 'read': read}))
    try: dist.destroy_process_group()
    except Exception: pass
