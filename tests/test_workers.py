"""A pass's loader workers stop when the pass ends, however it ends (issue 46): torch's `DataLoader` and torchdata's
`StatefulDataLoader`, each with 2 worker processes, have none left the moment `fit()` returns, after a fit that ends
normally, is cancelled (`CancelFitException`, as `EarlyStoppingCB` and `SingleBatchCB` end one), has an epoch cancelled,
fails, stops early inside a run measured in steps, or resumes inside an epoch and is cancelled (by replay, or by state).
Before, `trainer.exception` kept the cancel, whose traceback held the pass's iterator (and the trainer itself): its workers
lived until the garbage collector freed them, when torch waited about 5 s for each (10.3-11.2 s for two)."""
import multiprocessing as mp, warnings
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from aisaac.core.callback import Callback, CancelFitException, CancelEpochException
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.stoppers import EarlyStoppingCB
from aisaac.callbacks.savers import CheckpointCB, last_checkpoint

torch.set_num_threads(1)

def loader(kind, n=40, bs=4, **kw):
    "10 batches, 2 worker processes (forked: they start in milliseconds)"
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, 2, generator=g), torch.randn(n, 1, generator=g))
    if kind == 'StatefulDataLoader': from torchdata.stateful_dataloader import StatefulDataLoader as cls
    else: cls = DataLoader
    return cls(ds, bs, num_workers=2, multiprocessing_context='fork', **kw)

KINDS = ['DataLoader', pytest.param('StatefulDataLoader', marks=pytest.mark.skipif(not __import__('importlib').util.find_spec('torchdata'), reason='torchdata'))]

class RaiseAt(Callback):
    "Raise `exc` after training batch `n`"
    def __init__(self, exc, n=2): self.exc, self.n = exc, n
    def after_batch(self, trainer):
        if trainer.training and trainer.batch_num == self.n: raise self.exc

def trainer(kind, *cbs, **kw):
    return Trainer(DataLoaders(loader(kind, **kw), loader(kind, **kw)), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[BasicTrainCB(), *cbs])

@pytest.fixture(autouse=True)
def no_children_before():
    assert mp.active_children() == [], 'a process of an earlier test is still running'

def workers(): return len(mp.active_children())

ENDINGS = {
    'end': (lambda: [], dict(n_epochs=2)),
    'cancel': (lambda: [RaiseAt(CancelFitException('stop'))], dict(n_epochs=2)),
    'cancelled epoch': (lambda: [RaiseAt(CancelEpochException('skip'))], dict(n_epochs=2)),
    'early stop in steps': (lambda: [MetricsCB(show=False), EarlyStoppingCB(patience=1, threshold=10)], dict(n_epochs=1, steps=12, valid_every=3)),
    'steps': (lambda: [], dict(n_epochs=1, steps=3)),
}

@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('ending', list(ENDINGS))
def test_no_worker_is_left_when_the_fit_returns(kind, ending, capsys):
    cbs, kw = ENDINGS[ending]
    t = trainer(kind, *cbs())
    t.fit(lr=0.1, **kw)
    assert workers() == 0
    assert t.outcome == ('cancelled' if ending in ('cancel', 'early stop in steps') else 'ok')
    if ending not in ('end', 'steps'): assert t.exception.__traceback__ is None  # the cancel is kept, not its frames

@pytest.mark.parametrize('kind', KINDS)
def test_no_worker_is_left_when_the_fit_fails(kind):
    t = trainer(kind, RaiseAt(ValueError('boom')))
    with pytest.raises(ValueError, match='boom') as e: t.fit(2, lr=0.1)
    assert workers() == 0
    assert e.value.__traceback__ is not None  # an error keeps its traceback: it is raised to the caller

@pytest.mark.parametrize('kind', KINDS)
def test_no_worker_is_left_by_a_resumed_pass_that_is_cancelled(kind, tmp_path):
    "A checkpoint after 3 batches; the resumed pass replays them (DataLoader) or loads its state (StatefulDataLoader), then is cancelled"
    first = trainer(kind, CheckpointCB(tmp_path, every_n_epochs=None, every_n_batches=3), RaiseAt(CancelFitException('stop'), n=4))
    first.fit(2, lr=0.1)
    assert workers() == 0
    again = trainer(kind, RaiseAt(CancelFitException('stop'), n=6))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # (the replay says so)
        again.fit(2, lr=0.1, resume_from=last_checkpoint(tmp_path))
    assert again.batch_num == 6 and workers() == 0

def test_persistent_workers_stay_for_the_next_epoch_and_the_pass_loader_is_the_loader():
    "`persistent_workers=True`: the loader keeps its workers between passes and after a cancel, as asked; `trainer.dl` is the loader itself"
    seen = []
    class Peek(Callback):
        def before_epoch(self, t): seen.append(t.dl is (t.dls.train if t.training else t.dls.valid))
    t = trainer('DataLoader', Peek(), RaiseAt(CancelFitException('stop'), n=3), persistent_workers=True)
    t.fit(1, lr=0.1, valid=False)
    t.fit(1, lr=0.1)
    assert workers() == 2 and seen == [True] * 2  # the training loader's two, kept from the first fit to the second
    t.dls.train._iterator._shutdown_workers()
    assert workers() == 0

@pytest.mark.parametrize('kind', KINDS)
def test_a_progress_bar_over_the_loader_is_closed_with_its_iterator(kind):
    "ProgressCB's bar is a generator over the loader: closing it frees the loader's iterator inside (a StatefulDataLoader, which keeps its iterator, has it shut down)"
    from aisaac.callbacks.progress import ProgressCB
    import contextlib, io
    t = trainer(kind, ProgressCB(bars=True), RaiseAt(CancelFitException('stop')))
    with contextlib.redirect_stdout(io.StringIO()): t.fit(2, lr=0.1)
    assert workers() == 0
