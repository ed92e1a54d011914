"""Sharded training on 2 CPU processes (torchrun, gloo), for tests/test_sharding.py:

    torchrun --standalone --nproc_per_node 2 sharding_run.py OUT CASE [OPTION...]

CASE 'fit': a tiny `aisaac.models.GPT` trained 2 epochs with `FSDPCB` (each process 2 sequences a batch, `DistributedSampler`), with
the options: 'clip' (GradClipCB(0.05)), 'norm' (GradNormCB), 'ac' (ActivationCheckpointCB), 'bf16' (mixed precision), 'offload'
(CPU offload), 'accum' (GradAccumCB(2), half the batch, and `trainer.sync_gradients` set as GradAccumCB will), 'ddp' (DistributedDataParallel instead of FSDPCB), 'transaction' (a second fit inside `trainer.transaction()`).
Each process writes OUT/result_<rank>.json: the mean loss of both processes at each step, the norms, the whole weights after the fit.
CASE 'refuse': a callback that needs what a main-only callback provides (refused on rank 1 only), on 'ddp' or 'fsdp'; with 'resume',
instead, rank 1 alone resumes from a file that is not there (refused by `check_fit`); each process writes the error its fit raised.
CASE 'lrfind': `lr_find` with FSDPCB before the first fit (FSDPCB shards the model in the sweep), a fit of 1 epoch, `lr_find` again;
each process writes its suggestions, its curves and whether the whole weights after each sweep are those before it.
`make_data`, `make_model` and `callbacks` also make the single-process reference of the test.
"""
import datetime, json, sys, time, types
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.models import GPT, lm_loss
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.gradients import GradAccumCB, GradClipCB
from aisaac.callbacks.monitors import GradNormCB
from aisaac.callbacks.sharding import FSDPCB, ActivationCheckpointCB
import aisaac.callbacks.lr_finder  # (adds `Trainer.lr_find`)

VOCAB, T, N, BS = 32, 8, 16, 4  # 16 sequences of 8 tokens: 4 steps an epoch with a global batch of 4

def make_data():
    "The training and validation sequences: inputs and their next tokens"
    toks = torch.randint(0, VOCAB, (N + 4, T + 1), generator=torch.Generator().manual_seed(0))
    return TensorDataset(toks[:N, :-1], toks[:N, 1:]), TensorDataset(toks[N:, :-1], toks[N:, 1:])

def make_model():
    torch.manual_seed(0)
    return GPT(VOCAB, n_layer=2, n_head=2, d_model=16, block_size=T)

def loaders(world=1, bs=BS):
    "Loaders of a global batch of `bs` sequences: on `world` processes, each takes every `world`-th sequence"
    ds, vds = make_data()
    if world == 1: return types.SimpleNamespace(train=DataLoader(ds, bs), valid=DataLoader(vds, bs))
    return types.SimpleNamespace(train=DataLoader(ds, bs // world, sampler=DistributedSampler(ds, shuffle=False)),
                                 valid=DataLoader(vds, bs // world, sampler=DistributedSampler(vds, shuffle=False)))

def _float(t):
    "A one-element tensor (a DTensor's whole value) as a number"
    return float(t.full_tensor() if hasattr(t, 'full_tensor') else t)

class Record(Callback):
    "Each training step's loss; with a `GradClipCB`, its norm before clipping and the gradients' total norm after"
    order = 30  # after GradClipCB (20) in `before_step`
    def __init__(self): self.losses, self.norms, self.clipped = [], [], []
    def after_loss(self, trainer):
        if trainer.model.training: self.losses.append(trainer.loss.detach().clone())
    def before_step(self, trainer):
        clip = next((cb for cb in trainer.cbs if isinstance(cb, GradClipCB)), None)
        if clip is None: return
        self.norms.append(_float(clip.norm))
        self.clipped.append(_float(torch.nn.utils.get_total_norm([p.grad for p in trainer.model.parameters() if p.grad is not None])))

class SyncFlag(Callback):
    "Says, as `GradAccumCB` will, whether a step follows this backward (`trainer.sync_gradients`): on every 2nd training batch; records whether the gradients were reduced"
    order = -20  # before FSDPCB's `before_backward`
    def __init__(self): self.n, self.reduced = 0, []
    def before_backward(self, trainer): trainer.sync_gradients = self.n % 2 == 1; self.n += 1
    def after_backward(self, trainer): self.reduced.append(any(p.grad is not None for p in trainer.model.parameters()))

def callbacks(opts):
    "The callbacks of the fit, but its sharding"
    return [BasicTrainCB(), Record(), *([GradClipCB(0.05)] if 'clip' in opts else []), *([GradNormCB(per_layer=False)] if 'norm' in opts else []),
            *([ActivationCheckpointCB()] if 'ac' in opts else []), *([GradAccumCB(2), SyncFlag()] if 'accum' in opts else [])]

def full_weights(model):
    "The model's whole weights, in order, as one list (a sharded parameter gathered)"
    return torch.cat([(p.full_tensor() if hasattr(p, 'full_tensor') else p).detach().float().flatten() for p in model.parameters()]).tolist()

def run_fit(out, opts):
    model = make_model()
    try: shard = [] if 'ddp' in opts else [FSDPCB(mixed_precision='bf16' in opts, cpu_offload='offload' in opts)]
    except Exception as e: return {'error': f'{type(e).__name__}: {e}'}
    if 'ddp' in opts: model = nn.parallel.DistributedDataParallel(model)
    cbs = callbacks(opts)
    trainer = Trainer(loaders(2, BS // 2 if 'accum' in opts else BS), lm_loss, torch.optim.AdamW, model, callbacks=cbs + shard)
    res = {}
    trainer.fit(2, lr=1e-2)
    if 'transaction' in opts:
        before = full_weights(model)
        with trainer.transaction(): trainer.fit(1, lr=1e-2)
        res['restored'] = full_weights(model) == before
        trainer.fit(1, lr=1e-2)  # the model trains on after the transaction
    rec = cbs[1]
    losses = torch.stack([l.float() for l in rec.losses])
    dist.all_reduce(losses)
    res.update(losses=(losses / 2).tolist(), norms=rec.norms, clipped=rec.clipped, weights=full_weights(model),
               param_type=type(next(model.parameters())).__name__, param_dtype=str(next(model.parameters()).dtype),
               grad_norm=trainer.history.get_metric_values('grad_norm', per='batch') if 'norm' in opts else None,
               valid_loss=_float(trainer.loss) if 'ddp' not in opts else None, reduced=cbs[-1].reduced if 'accum' in opts else None)
    return res

class NeedsMain(Callback):
    "Needs `main_value`, which only a main-only callback provides"
    needs, provides = ('main_value',), ()

class ProvidesMain(Callback):
    "Provides `main_value`, on the main process only"
    runs_on, provides = 'main', ('main_value',)

def run_refuse(out, opts):
    model = make_model()
    if 'ddp' in opts: model, shard = nn.parallel.DistributedDataParallel(model), []
    else: shard = [FSDPCB()]
    trainer = Trainer(loaders(2), lm_loss, torch.optim.SGD, model, callbacks=[BasicTrainCB(), *([] if 'resume' in opts else [ProvidesMain(), NeedsMain()]), *shard])
    try: trainer.fit(1, resume_from=str(out/'missing.pt') if 'resume' in opts and dist.get_rank() == 1 else None)
    except Exception as e: return {'error': f'{type(e).__name__}: {e}', 'notes': getattr(e, '__notes__', [])}
    return {'error': None}

def run_lr_find(out, opts):
    model = make_model()
    trainer = Trainer(loaders(2), lm_loss, torch.optim.AdamW, model, callbacks=[BasicTrainCB(), FSDPCB()])
    res, before = {}, full_weights(model)
    for when in ('first', 'after_fit'):
        try: finder = trainer.lr_find(start_lr=1e-4, max_epochs=4, plot=False)
        except Exception as e: return {**res, 'error': f'{type(e).__name__}: {e}'}
        res[when] = dict(suggestion=finder.suggestion, lrs=finder.lrs, losses=finder.losses, restored=full_weights(model) == before,
                         param_type=type(next(model.parameters())).__name__)
        trainer.fit(1, lr=1e-2)  # it trains on (the first time, on the shards FSDPCB made in the sweep)
        res[when]['trained'] = full_weights(model) != before
        before = full_weights(model)
    return res

def run_memory(out, opts):
    "On this one process (no torchrun): 2 steps of a GPT with large activations, with or without 'ac'; the losses and the peak RSS"
    torch.manual_seed(0)
    model = GPT(64, n_layer=8, n_head=2, d_model=32, block_size=256)
    toks = torch.randint(0, 64, (64, 257), generator=torch.Generator().manual_seed(0))
    dls = types.SimpleNamespace(train=DataLoader(TensorDataset(toks[:, :-1], toks[:, 1:]), 32), valid=[])
    rec = Record()
    t = Trainer(dls, lm_loss, torch.optim.SGD, model, callbacks=[BasicTrainCB(), rec, *([ActivationCheckpointCB()] if 'ac' in opts else [])])
    t.fit(1, lr=0.1, valid=False)
    # the peak of this process's own memory (`VmHWM`): `ru_maxrss` keeps, across `exec`, the peak of the process that started it
    # (pytest's, after hundreds of tests, hides both runs' peaks)
    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))
    return {'losses': [float(l) for l in rec.losses], 'maxrss_mib': int(hwm.split()[1]) / 1024}

if __name__ == '__main__':
    out, case, opts = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if case == 'memory':
        (out/f'memory{"_ac" if "ac" in opts else ""}.json').write_text(json.dumps(run_memory(out, opts)))
        sys.exit()
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    rank, start = dist.get_rank(), time.time()
    res = {'fit': run_fit, 'refuse': run_refuse, 'lrfind': run_lr_find}[case](out, opts)
    res.update(rank=rank, seconds=time.time() - start)
    (out/f'result_{rank}.json').write_text(json.dumps(res))
    dist.destroy_process_group()
