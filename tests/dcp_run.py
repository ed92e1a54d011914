"""Sharded checkpoints of a tiny GPT for tests/test_dcp.py: under torchrun (gloo, CPU) the model is sharded per block with FSDP2's
`fully_shard` (its parameters become DTensors); run with plain `python`, it is one process and not sharded.

    torchrun --standalone --nproc_per_node N dcp_run.py OUT JOB [JOB ...]
    python dcp_run.py OUT JOB [JOB ...]

Each JOB, run in turn in the same processes, is
    straight:NAME:DIR:EPOCHS[:EVERY]  a fresh fit of EPOCHS epochs with CheckpointCB(DIR, every='4 steps', or EVERY)
    resume:NAME:CKPT:EPOCHS    a fresh trainer that resumes the checkpoint CKPT (a folder or a file) for EPOCHS epochs in all
                               (resume:NAME:CKPT:EPOCHS:accum with GradAccumCB(2), :accum3 with GradAccumCB(3), :wide a GPT of width 32)
    kill:NAME:DIR:EPOCHS       as straight, with checkpoints every 2 batches; process 1 is killed (SIGKILL) at the 2nd checkpoint,
                               once it has written its shards and before the processes agree that the checkpoint is complete
    preempt:NAME:DIR:EPOCHS    as straight, with PreemptionCB(DIR, exit=False) and no CheckpointCB; process 1 alone gets SIGTERM in
                               the 4th batch (after 3 optimizer steps); preempt:NAME:DIR:EPOCHS:accum with GradAccumCB(2) (the
                               signal in the 7th batch, the first of a window); :accum3 with GradAccumCB(3), the signal after 2 steps
                               (in the 7th batch: the processes agree on it at the epoch's end, inside a window)
    export:NAME:DIR            `save_full_weights` of a fresh sharded model resumed from DIR's last checkpoint, to OUT/NAME.full.pt
    accum:NAME:DIR:EPOCHS:EVERY[:accumN]  as straight, with GradAccumCB(2) (or N) and CheckpointCB(DIR, every=EVERY) ('2 steps', or '3 batches': inside a window)
    best:NAME:DIR:EPOCHS       as straight, with MetricsCB and SaveBestModelCB(DIR/best.pt, greater_is_better=True) and no CheckpointCB
    background:NAME:DIR:EPOCHS[:held|:fails]  as straight, with CheckpointCB(DIR, every='4 steps', background=True): the shards by
                               DCP's `async_save`, the rest in the engine's background thread; `held`: each process holds its part of
                               the first checkpoint (in `_written`, before the agreement) until it has taken 3 more training batches,
                               and records them, with whether the checkpoint was still under way at each; `fails`: process 1 cannot write its random state for the
                               second checkpoint (an OSError in the background), and the fit's error is recorded
    logs:NAME:DIR:EPOCHS[:CKPT:FROM]  as straight, with MetricsCB, CSVLogger, JSONLinesLogger and ResultsFileCB writing OUT/NAME.csv,
                               OUT/NAME.jsonl and OUT/NAME.results.jsonl; with CKPT, the fit resumes it, in copies of the files the
                               job FROM wrote (as an interrupted run leaves them: past the checkpoint)
A JOB whose kind starts with 'f' (fstraight, fresume, fpreempt, faccum, fbest) leaves the model whole and gives the trainer `FSDPCB`, which
shards it in its `before_fit` (under torchrun; on one plain process the model stays whole and no FSDPCB is added).
Each job writes OUT/NAME.pt (main process: the final weights, whole) and OUT/NAME_<rank>.json (the SHA-256 of the process's torch
random state when each checkpoint was saved and when one was loaded, the warnings, the outcome, the broadcasts aisaac made).
With AISAAC_NCCL_RULE=1 in the environment, a collective that aisaac's own code makes on a CPU tensor in the default process group
raises, as NCCL (the backend of every GPU run) does: a stand-in for NCCL's rule on these CPU processes.

The data give every process its part of the same global batch of 8 sequences, whatever the number of processes (process r of W takes
rows r, r+W, ... and batches of 8/W), so a run on 1 process and one on 2 take the same optimizer steps (up to float rounding).
"""
import datetime, hashlib, json, os, shutil, signal, sys, threading, warnings
from pathlib import Path
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.utils.data import DataLoader, TensorDataset
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders
from aisaac.models import GPT
from aisaac.persist import CheckpointEngine
from aisaac.dcp import ShardedCheckpointEngine, is_sharded, save_full_weights
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.schedule import OneCycleSchedulerCB
from aisaac.callbacks.savers import CheckpointCB, PreemptionCB, SaveBestModelCB, last_checkpoint
from aisaac.callbacks.gradients import GradAccumCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.loggers import CSVLogger, JSONLinesLogger
from aisaac.callbacks.results import ResultsFileCB
from aisaac.callbacks.sharding import FSDPCB

V, T, N, BS = 32, 8, 64, 8  # vocabulary, tokens per sequence, sequences, global batch
LOG_FILES = ('.csv', '.jsonl', '.results.jsonl')  # what a 'logs' job writes
BROADCASTS = [0]  # the `dist.broadcast`s aisaac's own code made in this job

def _watch(name, f):
    "`torch.distributed`'s `name` collective, counting aisaac's broadcasts; with AISAAC_NCCL_RULE, refusing aisaac's CPU tensors in the default group"
    def collective(tensor, *args, group=None, **kwargs):
        if sys._getframe(1).f_globals.get('__name__', '').startswith('aisaac'):
            BROADCASTS[0] += name == 'broadcast'
            if os.environ.get('AISAAC_NCCL_RULE') and tensor.device.type == 'cpu' and group in (None, dist.group.WORLD):
                raise RuntimeError(f"No backend type associated with device type cpu (a stand-in for NCCL: {name} of a CPU tensor in the default group)")
        return f(tensor, *args, group=group, **kwargs)
    return collective
for _name in ('all_reduce', 'broadcast'): setattr(dist, _name, _watch(_name, getattr(dist, _name)))

def world(): return (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)

def make_dls():
    "This process's part of every global batch"
    W, r = world()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (N, T + 1), generator=g)
    xs, ys = x[r::W, :-1], x[r::W, 1:]
    return DataLoaders(DataLoader(TensorDataset(xs, ys), BS // W), DataLoader(TensorDataset(xs[:16 // W], ys[:16 // W]), BS // W))

def lm_loss(logits, y): return F.cross_entropy(logits.flatten(0, 1), y.flatten())

def digest(t): return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]

class Record(Callback):
    "The SHA-256 of this process's torch random state at each checkpoint saved and loaded"
    def __init__(self): self.saved, self.loaded = {}, None
    def after_save_checkpoint(self, trainer, path=None, **kw):
        self.saved[f'{trainer.epoch}_{trainer.batch_num}'] = digest(torch.get_rng_state())
    def after_load_checkpoint(self, trainer, **kw): self.loaded = digest(torch.get_rng_state())

class SignalAt(Callback):
    "On process 1 only, send this process SIGTERM in the training pass's `after_loss` once `step` optimizer steps are taken"
    def __init__(self, step=3): self.step = step
    def after_loss(self, trainer):
        if world()[1] == 1 and trainer.model.training and trainer.clock.step == self.step: os.kill(os.getpid(), signal.SIGTERM)

class During(Callback):
    "The training steps taken after the first background checkpoint was asked for, while `hold` (as the engine's `_written`, in the background thread) keeps it from completing, and whether it was still under way at each; lets it go after 3"
    def __init__(self): self.go, self.asked, self.batches, self.last = threading.Event(), False, [], None
    def hold(self): assert self.go.wait(60), 'never let go'
    def after_save_checkpoint(self, trainer): self.asked = True
    def after_batch(self, trainer):
        if not trainer.model.training: return
        self.last = trainer.clock.step
        if self.asked and not self.go.is_set():
            self.batches.append((trainer.clock.step, bool(trainer.checkpoint_engine.queue.writes())))
            if len(self.batches) == 3: self.go.set()

def accum_cbs(opts):
    "[GradAccumCB(N)] for the option 'accumN' ('accum': 2), or none"
    return [GradAccumCB(int(opts[0][5:] or 2))] if opts else []

def make_trainer(callbacks=(), fsdpcb=False, d_model=16):
    "The same GPT every time, sharded per block under torchrun (by hand, or with `fsdpcb` by FSDPCB in the fit); each process's random state its own (seeded by its rank)"
    torch.manual_seed(0)
    model = GPT(V, n_layer=2, n_head=2, d_model=d_model, block_size=T)
    if fsdpcb and dist.is_initialized(): callbacks = [*callbacks, FSDPCB()]
    elif dist.is_initialized():
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks: fully_shard(block)
        fully_shard(model)
        assert is_sharded(model)
    torch.manual_seed(100 + world()[1])
    rec = Record()
    return Trainer(make_dls(), lm_loss, torch.optim.AdamW, model, callbacks=[BasicTrainCB(), OneCycleSchedulerCB(), rec, *callbacks]), rec

def full_weights(model):
    "The whole weights, on every process"
    if not is_sharded(model): return {k: v.detach().clone() for k, v in model.state_dict().items()}
    return get_state_dict(model, [], options=StateDictOptions(full_state_dict=True))[0]

def run(out, job):
    kind, name, *args = job.split(':')
    W, rank = world()
    fsdpcb, kind = kind.startswith('f'), kind.removeprefix('f')
    make = lambda cbs=(), **kw: make_trainer(cbs, fsdpcb, **kw)
    res, BROADCASTS[0] = {'world': W}, 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        if kind in ('straight', 'kill'):
            dir, n, *every = args
            t, rec = make([CheckpointCB(dir, every_n_epochs=None, keep_last=None, **({'every': every[0] if every else '4 steps'} if kind == 'straight' else {'every_n_batches': 2}))])
            if kind == 'kill':
                calls = []
                def written(self, tmp, r):
                    calls.append(tmp)
                    if r == 1 and len(calls) == 2:
                        Path(out/f'{name}.killed').write_text(str(tmp))
                        os.kill(os.getpid(), signal.SIGKILL)
                ShardedCheckpointEngine._written = written
            t.fit(int(n), lr=1e-2)
        elif kind == 'preempt':
            dir, n, *accum = args
            t, rec = make([*accum_cbs(accum), PreemptionCB(dir, exit=False), SignalAt(2 if accum == ['accum3'] else 3)])
            try: t.fit(int(n), lr=1e-2)
            except Exception as e: res['error'] = f'{type(e).__name__}: {e}'
        elif kind == 'resume':
            ckpt, n, *opts = args
            t, rec = make(accum_cbs([o for o in opts if o.startswith('accum')]), **({'d_model': 32} if 'wide' in opts else {}))
            try: t.fit(int(n), lr=1e-2, resume_from=ckpt)
            except Exception as e: res['error'] = f'{type(e).__name__}: {e}'
            res['param_type'] = type(t.model.head.weight).__name__
        elif kind == 'accum':
            dir, n, every, *accum = args
            t, rec = make([*accum_cbs(accum or ['accum']), CheckpointCB(dir, every_n_epochs=None, keep_last=None, every=every)])
            try: t.fit(int(n), lr=1e-2)
            except Exception as e: res['error'] = f'{type(e).__name__}: {e}'
        elif kind == 'best':
            dir, n = args
            best = SaveBestModelCB(Path(dir)/'best.pt', greater_is_better=True)  # (the loss goes down: the best is epoch 0's, loaded back at the end)
            t, rec = make([MetricsCB(), best])
            t.fit(int(n), lr=1e-2)
            res.update(best_epoch=best.best_epoch, best=best.best)
        elif kind == 'background':
            dir, n, *opt = args
            t, rec = make([CheckpointCB(dir, every_n_epochs=None, keep_last=None, every='4 steps', background=True), during := During()])
            if opt == ['held']: ShardedCheckpointEngine._written = lambda engine, tmp, r: during.hold()
            if opt == ['fails'] and rank == 1:
                real, saves = CheckpointEngine.save, []
                def fails(self, state, path):
                    if Path(path).name == 'rng_1.pt' and len(saves) == 1: raise OSError(28, 'No space left on device')
                    if Path(path).name == 'rng_1.pt': saves.append(path)
                    return real(self, state, path)
                CheckpointEngine.save = fails
            try: t.fit(int(n), lr=1e-2)
            except Exception as e: res['error'] = f'{type(e).__name__}: {e}'
            res.update(during=during.batches, at_error=during.last)
        elif kind == 'logs':
            dir, n, *resume = args
            files = [out/f'{name}{ext}' for ext in LOG_FILES]
            if resume and rank == 0:
                for f, ext in zip(files, LOG_FILES): shutil.copy(out/f'{resume[1]}{ext}', f)
            if resume: dist.barrier()
            t, rec = make([MetricsCB(), CSVLogger(files[0]), JSONLinesLogger(files[1]), ResultsFileCB(files[2]),
                           CheckpointCB(dir, every_n_epochs=None, keep_last=None, every='4 steps')])
            try: t.fit(int(n), lr=1e-2, resume_from=resume[0] if resume else None)
            except Exception as e: res['error'] = f'{type(e).__name__}: {e}'
        elif kind == 'export':
            t, rec = make()
            t.load_checkpoint(last_checkpoint(args[0]))
            save_full_weights(t.model, out/f'{name}.full.pt')
    res.update(saved=rec.saved, loaded=rec.loaded, warnings=[str(w.message) for w in caught if 'aisaac' in str(w.filename) or 'resumes on' in str(w.message)],
               outcome=getattr(t, 'outcome', None), broadcasts=BROADCASTS[0])
    weights = full_weights(t.model)
    if rank == 0: torch.save(weights, out/f'{name}.pt')
    (out/f'{name}_{rank}.json').write_text(json.dumps(res))

if __name__ == '__main__':
    out, jobs = Path(sys.argv[1]), sys.argv[2:]
    if 'RANK' in os.environ: dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    for job in jobs:
        if job.startswith('@'): out = Path(job[1:])  # the folder of the next jobs' results (several tests' jobs in one launch)
        else: run(out, job)
    if dist.is_initialized(): dist.destroy_process_group()
