"""Two CPU processes (torchrun, gloo, DistributedDataParallel) in which one process alone stops or fails, for tests/test_ranks.py:

    torchrun --standalone --nproc_per_node 2 ranks_run.py OUT CASE [plain]

CASE is 'cancel' (rank 0 raises CancelFitException in `after_loss` once 3 optimizer steps are taken), 'early' (EarlyStoppingCB stops
on rank 0 only, whose metric gets worse after epoch 0), 'epoch' (rank 1 raises CancelEpochException in `after_batch` once 2 steps are
taken), 'error' (rank 1 raises ValueError in `after_loss` once 3 steps are taken, then goes on as a notebook's kernel
would: it waits, alive, until rank 0 has written its result, at most WAIT s) 'loader' (rank 1's validation loader raises OSError at its 3rd batch, outside any handler, then rank 1 goes on),
'loader_end' (the same at the loader's end, after its 4th and last batch, with MetricsCB, whose end of the pass is a collective) or 'preempt'
(rank 1 alone gets SIGTERM in `after_loss` once 3 steps are taken, under PreemptionCB(OUT/'ckpt', exit=False)) or 'one_batch' (OneBatchCB on
both: the fit ends with its first batch, its stop raised after the step), 'one_batch_error' (the same, and rank 1 raises ValueError in
that batch's `after_batch`, after the step), 'one_batch_accum' (OneBatchCB under GradAccumCB(2): the fit ends with the first
micro-batch, whose step is skipped), 'accum_cancel' (rank 1 raises CancelFitException in the first micro-batch's `after_backward`
under GradAccumCB(2)), 'refuse_all' (every
process refuses each of 20 fits: a callback raises TypeError in `before_fit`; each process writes the error of each fit). With `plain` the fit runs without the agreements
(`trainer.ranks_agree = False`): each case then ends wrong, or waits for the other process, until the gloo timeout (60 s here)
or until that process exits. Each process writes OUT/result_<rank>.json:
its outcome, error, optimizer steps, last epoch, weights, the stop's exception and times.
"""
import datetime, json, os, signal, sys, time, types
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from aisaac.core.callback import Callback, CancelEpochException, CancelFitException
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB, OneBatchCB
from aisaac.callbacks.gradients import GradAccumCB
from aisaac.callbacks.stoppers import EarlyStoppingCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.savers import PreemptionCB

class RaiseAt(Callback):
    "On process `rank` only, raise `exc` in the training pass's `event` once `steps` optimizer steps are taken"
    def __init__(self, rank, event, steps, exc): self.rank, self.event, self.steps, self.exc, self.raised_at = rank, event, steps, exc, None
    def run_event(self, event, trainer, **kwargs):
        if (event == self.event and self.raised_at is None and dist.get_rank() == self.rank and trainer.model.training
                and trainer.clock.step == self.steps):
            self.raised_at = time.time()
            raise self.exc

class SignalAt(Callback):
    "On process `rank` only, send this process SIGTERM in the training pass's `after_loss` once `steps` optimizer steps are taken"
    def __init__(self, rank, steps): self.rank, self.steps, self.raised_at = rank, steps, None
    def after_loss(self, trainer):
        if self.raised_at is None and dist.get_rank() == self.rank and trainer.model.training and trainer.clock.step == self.steps:
            self.raised_at = time.time()
            os.kill(os.getpid(), signal.SIGTERM)

class Score(Callback):
    "Record the per-epoch metric 'score' after validation: on rank 0 it gets worse after epoch 0, on the other process better"
    def after_validate(self, trainer):
        trainer.history.update_metric('score', float(trainer.epoch if dist.get_rank() == 0 else -trainer.epoch), step=trainer.epoch)

class Refuse(Callback):
    "Refuse the fit on every process: a TypeError in `before_fit`"
    def before_fit(self, trainer): raise TypeError(f'refused on rank {dist.get_rank()}')

def refuse_all(model, n=20):
    "`n` fits, each refused on every process: the error each raised"
    errors = []
    for _ in range(n):
        t = Trainer(loaders(), nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[BasicTrainCB(), Refuse()])
        try: t.fit(1)
        except Exception as e: errors.append(f'{type(e).__name__}: {e}')
    return errors

class FailingLoader:
    "`dl`, whose iteration raises OSError at batch `at` on process `rank`"
    def __init__(self, dl, rank, at): self.dl, self.rank, self.at, self.raised_at = dl, rank, at, None
    def __len__(self): return len(self.dl)
    def __iter__(self):
        for i, b in enumerate(self.dl):
            if i == self.at and dist.get_rank() == self.rank and self.raised_at is None:
                self.raised_at = time.time()
                raise OSError(f'the disk is gone on rank {self.rank}')
            yield b
        if self.at == len(self.dl) and dist.get_rank() == self.rank and self.raised_at is None:  # at the loader's end, after its last batch
            self.raised_at = time.time()
            raise OSError(f'the disk is gone on rank {self.rank}')

def loaders(n=64, n_valid=32, bs=4):
    "8 training and 4 validation batches per process"
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)
    ds, vds = TensorDataset(x, y), TensorDataset(x[:n_valid], y[:n_valid])
    return types.SimpleNamespace(train=DataLoader(ds, bs, sampler=DistributedSampler(ds, shuffle=False)),
                                 valid=DataLoader(vds, bs, sampler=DistributedSampler(vds, shuffle=False)))

CASES = {'cancel': lambda: [RaiseAt(0, 'after_loss', 3, CancelFitException('rank 0 stops'))],
         'epoch': lambda: [RaiseAt(1, 'after_batch', 2, CancelEpochException('rank 1 ends the pass'))],
         'error': lambda: [RaiseAt(1, 'after_loss', 3, ValueError('a bad batch on rank 1'))],
         'early': lambda: [Score(), EarlyStoppingCB(patience=1, threshold=0., watch_metric='score')], 'loader': lambda: [],
         'loader_end': lambda: [MetricsCB(show=False)],
         'preempt': lambda: [SignalAt(1, 3), PreemptionCB(Path(sys.argv[1])/'ckpt', exit=False)],
         'one_batch': lambda: [OneBatchCB()],
         'one_batch_error': lambda: [RaiseAt(1, 'after_batch', 1, ValueError('a bad batch end on rank 1')), OneBatchCB()],
         'one_batch_accum': lambda: [GradAccumCB(2), OneBatchCB()],
         'accum_cancel': lambda: [RaiseAt(1, 'after_backward', 0, CancelFitException('rank 1 stops in a window')), GradAccumCB(2)]}

WAIT = 45  # seconds: how long a failed process stays alive waiting for the other's end, under the gloo timeout (60 s)

if __name__ == '__main__':
    out, case, plain = Path(sys.argv[1]), sys.argv[2], sys.argv[3:] == ['plain']
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    if case == 'refuse_all':
        (out/f'result_{rank}.json').write_text(json.dumps({'rank': rank, 'errors': refuse_all(model)}))
        dist.destroy_process_group(); sys.exit()
    cbs = CASES[case]()
    dls = loaders()
    if case == 'loader': dls.valid = FailingLoader(dls.valid, 1, 2)
    if case == 'loader_end': dls.valid = FailingLoader(dls.valid, 1, 4)
    trainer = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[BasicTrainCB(), *cbs])
    if plain: trainer.ranks_agree = False
    res, start = {'rank': rank}, time.time()
    try: trainer.fit(3, lr=0.1)
    except Exception as e: res['error'] = f'{type(e).__name__}: {e}'
    exc = getattr(trainer, 'exception', None)
    res.update(ended=time.time(), fit_seconds=time.time() - start, outcome=trainer.outcome, steps=trainer.clock.step, samples=trainer.clock.samples, epoch=trainer.epoch,
               weights=torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(), stop_reason=trainer.stop_reason,
               exception=None if exc is None else f'{type(exc).__name__}: {exc}', raised_at=getattr(dls.valid if case.startswith('loader') else cbs[0], 'raised_at', None),
               checkpoints=sorted(p.name for p in (out/'ckpt').glob('*.pt')) if case == 'preempt' else None)
    (out/f'result_{rank}.json').write_text(json.dumps(res))
    if case in ('error', 'loader', 'loader_end') and res['raised_at'] is not None:
        # it goes on (a notebook's kernel would), and the other must not wait for it: it waits, alive, for the other's result (rank 0 ended)
        # at most WAIT s, less than the gloo timeout a waiting rank 0 would reach; whether it came is in this process's result
        while not (out/'result_0.json').exists() and time.time() - res['ended'] < WAIT: time.sleep(0.05)
        res['other_ended_first'] = (out/'result_0.json').exists()
        (out/f'result_{rank}.json').write_text(json.dumps(res))
    try: dist.destroy_process_group()
    except Exception: pass
