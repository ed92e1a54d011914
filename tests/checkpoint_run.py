"""A small, deterministic training run for tests/test_checkpoint.py, importable and runnable in its own process:

    python checkpoint_run.py resume LOADER CHECKPOINT N_EPOCHS OUT [LOADER CHECKPOINT N_EPOCHS OUT ...]
    python checkpoint_run.py checkpoints LOADER DIR N_EPOCHS SLEEP     (CheckpointCB after every batch, SLEEP seconds per batch)
    python checkpoint_run.py kill_mid_save CHECKPOINT MARKER HOW        (HOW: 'half' or 'whole': how much of the second save is written)
    python checkpoint_run.py preempt LOADER DIR N_EPOCHS SLEEP MARKER  (PreemptionCB(DIR); MARKER counts the training batches done,
                                                                        MARKER.outcome gets the fit's outcome in its cleanup)
"""
import sys, time
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torcheval.metrics import MulticlassAccuracy
from aisaac.utils import set_seed
from aisaac.trainer import Trainer
from aisaac.core.callback import Callback, CancelFitException
import aisaac.checkpoint  # noqa: F401  (save_checkpoint, load_checkpoint, fit(resume_from=...))
import aisaac.persist
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.schedule import OneCycleSchedulerCB
from aisaac.callbacks.savers import CheckpointCB, PreemptionCB

LOADERS = ('dataloader', 'tensorloader', 'seeded')  # torch's shuffled DataLoader; TensorLoader on the global generator, or its own

def make_dls(loader, n=200, bs=16):
    "A 3-class problem; `loader` picks the kind of shuffled training loader"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, :2].sum(1) > 0).long() + (x[:, 2] > 0.5).long()
    if loader == 'dataloader':
        return DataLoaders(DataLoader(TensorDataset(x, y), bs, shuffle=True), DataLoader(TensorDataset(x[:64], y[:64]), bs))
    return DataLoaders(TensorLoader(x, y, bs=bs, shuffle=True, seed=3 if loader == 'seeded' else None), TensorLoader(x[:64], y[:64], bs=bs))

def make_trainer(loader='dataloader', callbacks=()):
    "A seeded trainer with dropout, AdamW, a one-cycle schedule and metrics on both passes: everything a resume must restore"
    set_seed(0, deterministic=True)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
    return Trainer(make_dls(loader), nn.CrossEntropyLoss(), torch.optim.AdamW, model,
                   callbacks=[BasicTrainCB(), MetricsCB(acc=MulticlassAccuracy(), train_metrics=True), OneCycleSchedulerCB(), *callbacks])

class StopAt(Callback):
    "Save a checkpoint at `path` at the end of training batch `batch` of `epoch` (or of the epoch, if `batch` is None), then stop the fit"
    def __init__(self, path, epoch, batch=None): self.path, self.epoch, self.batch = path, epoch, batch
    def checkpoint(self, trainer, at):
        "Save and stop at the chosen point"
        if trainer.epoch == self.epoch and ((at, self.batch) == ('epoch', None) or (at == 'batch' and trainer.batch_num == self.batch)):
            trainer.save_checkpoint(self.path)
            raise CancelFitException()

class Sleep(Callback):
    "Sleep `seconds` after each training batch (so that a test can signal the process mid-run)"
    def __init__(self, seconds): self.seconds = seconds
    def after_batch(self, trainer):
        "Sleep"
        if trainer.training: time.sleep(self.seconds)

class CountBatches(Callback):
    "Write the number of training batches done to `path` after each one, and the fit's outcome to `path`.outcome at its end"
    def __init__(self, path): self.path, self.n = Path(path), 0
    def after_batch(self, trainer):
        "Count"
        if trainer.training: self.n += 1; self.path.write_text(str(self.n))
    def cleanup_fit(self, trainer):
        "Record the outcome (before PreemptionCB exits: it runs last)"
        self.path.with_suffix('.outcome').write_text(trainer.outcome)

def result(trainer):
    "What must be equal between a straight and a resumed run: weights, optimizer state, history, metrics records"
    m = trainer.MetricsCB.state_dict()
    return {'model': trainer.model.state_dict(), 'opt': trainer.opt.state_dict(), 'history': trainer.history.state_dict(),
            'metrics': {k: m[k] for k in ('losses_epoch', 'metrics_epoch', 'losses_batch')}}

def resume(loader, path, n_epochs):
    "A new trainer that resumes the checkpoint at `path` for `n_epochs` in all"
    trainer = make_trainer(loader)
    trainer.fit(n_epochs, resume_from=path)
    return trainer

if __name__ == '__main__':
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == 'resume':
        for i in range(0, len(args), 4):
            loader, path, n, out = args[i:i+4]
            torch.save(result(resume(loader, path, int(n))), out)
    elif mode == 'checkpoints':
        loader, dir, n, sleep = args
        make_trainer(loader, [CheckpointCB(dir, every_n_batches=1, keep_last=None), Sleep(float(sleep))]).fit(int(n))
    elif mode == 'preempt':
        loader, dir, n, sleep, marker = args
        make_trainer(loader, [PreemptionCB(dir), Sleep(float(sleep)), CountBatches(marker)]).fit(int(n))
        print('the fit returned')  # never, after a preemption: PreemptionCB exits
    elif mode == 'kill_mid_save':
        path, marker, how = args
        trainer = make_trainer()
        trainer.fit(1)
        trainer.save_checkpoint(path)
        real_save = torch.save
        def stalled_save(obj, f):  # writes all or half of the temporary file, tells the test, and waits to be killed
            real_save(obj, f)
            if not isinstance(f, (str, Path)): return  # a check in memory, not the file
            if how == 'half': Path(f).write_bytes(Path(f).read_bytes()[:Path(f).stat().st_size // 2])
            Path(marker).write_text(str(f))
            time.sleep(600)
        aisaac.persist.torch.save = stalled_save
        trainer.fit(2)
        trainer.save_checkpoint(path)
