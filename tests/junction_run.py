"""Two CPU processes (torchrun, gloo) where a callback meets several processes, for tests/test_junction_ranks.py:

    torchrun --standalone --nproc_per_node 2 junction_run.py OUT CASE

CASE 'lsuv': a DistributedDataParallel MLP (with a BatchNorm) initialised by `LSUVInitCB` on each process's first batch (each its own
half of the data), then one step at lr 0: each process writes its weights. CASE 'preds', 'preds_early', 'preds_dict': `capture_preds`
and `Interpretation.from_trainer` on a validation set split by a `DistributedSampler` (the whole fit; a fit ended by a cancel after
the 2nd of 3 batches, with `CapturePredsCB`/`ItemLossesCB` directly; dict batches): each process writes what it captured. CASE 'lm':
a DDP language model (each position's scores from its own token) trained with `lm_loss`, a mean over the tokens not -100, on padded
sequences of 1 to 9 tokens, 2 a batch on each process (the global batch of 4 that one process trains on): each writes its weights.
`data` and `make_model` also make the single-process reference of the tests.
"""
import datetime, json, sys
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, Dataset
from torch.utils.data.distributed import DistributedSampler
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders
from aisaac.core.callback import Callback, CancelFitException
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.init import LSUVInitCB
from aisaac.callbacks.preds import CapturePredsCB
from aisaac.callbacks.interpret import ItemLossesCB, Interpretation
import aisaac.checkpoint  # noqa: F401  (transactions)

def data(n=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g); y = (x[:, :2].sum(1) > 0).long() + (x[:, 2] > 0.5).long()
    return x, y

def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))

class Dicts(Dataset):
    def __init__(self, x, y): self.x, self.y = x, y
    def __len__(self): return len(self.x)
    def __getitem__(self, i): return {'x': self.x[i], 'labels': self.y[i]}

def loaders(world, dicts=False, bs=8):
    "The same 40 training and 30 validation samples; with `world` 2, each process its half (a `DistributedSampler`), `bs` // 2 a batch"
    x, y = data(); xv, yv = data(30)
    ds, vs = (Dicts(x, y), Dicts(xv, yv)) if dicts else (TensorDataset(x, y), TensorDataset(xv, yv))
    samp = lambda d: DistributedSampler(d, shuffle=False) if world > 1 else None
    return DataLoaders(DataLoader(ds, bs // world, sampler=samp(ds)), DataLoader(vs, bs // world, sampler=samp(vs)))

def train_cb(dicts): return BasicTrainCB(input_keys='x', target_key='labels') if dicts else BasicTrainCB()

class StopAfter(Callback):
    "End the validation pass's fit (a cancel) after its `n`th batch"
    order = 1000
    def __init__(self, n): self.n = n
    def after_batch(self, trainer):
        if trainer.batch_num + 1 == self.n: raise CancelFitException()

class TokenLM(nn.Module):
    "Each position's scores from its own token only: padding cannot change the real positions"
    def __init__(self, vocab=50): super().__init__(); self.emb, self.out = nn.Embedding(vocab, 16), nn.Linear(16, vocab)
    def forward(self, x): return self.out(torch.tanh(self.emb(x)))

class Seqs(Dataset):
    "16 sequences of 1 to 9 tokens, their next tokens as labels"
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(1, 50, (1 + (i * 5) % 9 + 1,), generator=g) for i in range(16)]
    def __len__(self): return len(self.rows)
    def __getitem__(self, i): return self.rows[i]

def pad(rows):
    "Inputs padded with 0, labels (the next tokens) with -100"
    T = max(len(r) for r in rows) - 1
    x = torch.zeros(len(rows), T, dtype=torch.long); y = torch.full((len(rows), T), -100)
    for i, r in enumerate(rows): x[i, :len(r) - 1], y[i, :len(r) - 1] = r[:-1], r[1:]
    return x, y

def lm_loaders(world, bs=4):
    ds = Seqs()
    samp = DistributedSampler(ds, shuffle=False) if world > 1 else None
    return DataLoaders(DataLoader(ds, bs // world, sampler=samp, collate_fn=pad), DataLoader(ds, bs // world, sampler=samp, collate_fn=pad))

def lists(t): return None if t is None else t.tolist()

def resumed(out, world):
    "2 epochs with CapturePredsCB and ItemLossesCB, straight and resumed from the checkpoint of the first epoch: what each captured"
    from aisaac.callbacks.savers import CheckpointCB, checkpoints
    def fit(folder, resume=None):
        model = make_model()
        if world > 1: model = nn.parallel.DistributedDataParallel(model)
        cp, il = CapturePredsCB(inps=True), ItemLossesCB(keep=5)
        t = Trainer(loaders(world), nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[BasicTrainCB(), cp, il, CheckpointCB(folder, keep_last=None)])
        t.fit(2, lr=0.1, resume_from=resume)
        return {'preds': cp.all_preds.tolist(), 'targs': cp.all_targs.tolist(), 'inps': cp.all_inps.tolist(), 'losses': il.losses.tolist(),
                'top_idxs': il.top_idxs.tolist()}
    straight = fit(out/'ck')
    return {'straight': straight, 'resumed': fit(out/'ck2', resume=checkpoints(out/'ck')[0])}

def run(case, world, out=None):
    dicts = case == 'preds_dict'
    if case == 'preds_resume': return resumed(out, world)
    if case == 'lm':
        from aisaac.models import lm_loss
        torch.manual_seed(0)
        model = TokenLM()
        if world > 1: model = nn.parallel.DistributedDataParallel(model)
        t = Trainer(lm_loaders(world), lm_loss, torch.optim.SGD, model, callbacks=[BasicTrainCB()])
        t.fit(2, lr=0.5, valid=False)
        return {k.removeprefix('module.'): v.tolist() for k, v in t.model.state_dict().items()}
    model = make_model()
    if world > 1: model = nn.parallel.DistributedDataParallel(model)
    if case == 'lsuv':
        t = Trainer(loaders(world), nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[BasicTrainCB(), LSUVInitCB()])
        t.fit(1, lr=0., valid=False)
        return {k: v.tolist() for k, v in t.model.state_dict().items()}
    t = Trainer(loaders(world, dicts), nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[train_cb(dicts)])
    if case == 'preds_early':
        cp, il = CapturePredsCB(inps=True), ItemLossesCB(keep=3)
        t.fit(1, train=False, callbacks=[cp, il, StopAfter(2)])
        return {'preds': lists(getattr(cp, 'all_preds', None)), 'targs': lists(getattr(cp, 'all_targs', None)),
                'inps': lists(getattr(cp, 'all_inps', None)), 'losses': lists(getattr(il, 'losses', None)),
                'top_idxs': lists(getattr(il, 'top_idxs', None))}
    preds, targs, inps = t.capture_preds(inps=True)
    interp = Interpretation.from_trainer(t, keep=3)
    return {'preds': preds.tolist(), 'targs': targs.tolist(), 'inps': lists(inps) if isinstance(inps, torch.Tensor) else {k: lists(v) for k, v in inps.items()},
            'losses': interp.losses.tolist(), 'top_idxs': interp.top_idxs.tolist(), 'top': interp.top_losses(3)[1].tolist()}

if __name__ == '__main__':
    out, case = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    try: res = {'result': run(case, 2, out)}
    except Exception as e: res = {'error': f'{type(e).__name__}: {e}'}
    (out/f'result_{dist.get_rank()}.json').write_text(json.dumps(res))
    dist.destroy_process_group()
