"""Edge cases of the names aisaac offers AIsaac's and miniai's users (memory, helpers, collate, learner): what the
notebooks' examples do not show."""
import sys, types
from datetime import timedelta
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aisaac.core.callback import Callback, CancelFitException
from aisaac.callbacks.train import BasicTrainCB
from aisaac.collate import collate_device, get_dataloaders, get_dls
from aisaac.helpers import PPDict, accuracy, get_images, mask2idxs
from aisaac.learner import HasLearnCB, HasTrainerCB, Learner, run_cbs
from aisaac.memory import clean_traceback, clean_ipython_hist
from aisaac.trainer import Trainer
from tiny import make_dls

class LRs(Callback):
    def before_fit(self, trainer): self.lrs = []
    def before_step(self, trainer): self.lrs.append(trainer.opt.param_groups[0]['lr'])

def test_learner_fit_takes_the_trainer_positional_order():
    "aisaac code calls `fit(n_epochs, lr, callbacks)` on any trainer: a `Learner` reads it the same way"
    learn = Learner(nn.Linear(2, 1), make_dls(), lr=0.3, cbs=[BasicTrainCB()])
    rec = LRs()
    learn.fit(2, 0.05, [rec])
    assert rec.lrs == [0.05] * 4 and learn.lr == 0.3 and learn.n_epochs == 2

def test_learner_keeps_its_lr_when_a_fit_fails():
    class Boom(Callback):
        def after_step(self, trainer): raise ValueError('boom')
    learn = Learner(nn.Linear(2, 1), make_dls(), lr=0.3, cbs=[BasicTrainCB()])
    with pytest.raises(ValueError, match='boom'): learn.fit(1, lr=0.01, cbs=Boom())
    assert learn.lr == 0.3 and 'Boom' not in [type(cb).__name__ for cb in learn.cbs]

def test_learner_defaults_are_miniais():
    learn = Learner(nn.Linear(2, 1), make_dls(), cbs=BasicTrainCB())  # a single callback, not in a list
    assert (learn.lr, learn.loss_func, learn.opt_func) == (0.1, F.mse_loss, torch.optim.SGD)
    rec = LRs()
    learn.fit(cbs=rec)
    assert rec.lrs == [0.1] * 2 and learn.epoch == 0  # one epoch of two batches

def test_learner_is_a_trainer_with_the_same_checks():
    with pytest.raises(TypeError, match='train` and `valid'): Learner(nn.Linear(2, 1), [1, 2, 3])
    assert isinstance(Learner(nn.Linear(2, 1), make_dls()), Trainer)

@pytest.mark.parametrize('cls', [HasTrainerCB, HasLearnCB])
def test_has_trainer_lets_go_after_a_failed_or_cancelled_fit(cls):
    seen = []
    class Peek(cls):
        def after_batch(self, trainer):
            seen.append(self.trainer is trainer)
            raise self.exc
    cb = Peek()
    t = Trainer(make_dls(), nn.MSELoss(), model=nn.Linear(2, 1), callbacks=[BasicTrainCB(), cb])
    cb.exc = RuntimeError('failed')
    with pytest.raises(RuntimeError): t.fit(1)
    assert seen == [True] and cb.trainer is None
    cb.exc = CancelFitException()
    t.fit(1)
    assert seen == [True, True] and cb.trainer is None
    if cls is HasLearnCB: assert cb.learn is None

def test_run_cbs_order_and_missing_methods():
    log = []
    a = types.SimpleNamespace(order=1, go=lambda learn: log.append(('a', learn)))
    b = types.SimpleNamespace(go=lambda learn: log.append(('b', learn)))  # no `order`: 0
    c = types.SimpleNamespace(order=-1)  # no `go`: skipped
    run_cbs([a, b, c], 'go', 'L')
    assert log == [('b', 'L'), ('a', 'L')]

def test_get_dls_passes_keywords_to_both_loaders():
    ds = torch.utils.data.TensorDataset(torch.arange(10.), torch.arange(10))
    trn, val = get_dls(ds, ds, 3, drop_last=True)
    assert (len(trn), len(val), trn.drop_last, val.drop_last) == (3, 1, True, True)
    trn, val = get_dataloaders(ds, ds, 4, collate_fn=lambda b: collate_device(b, 'cpu'))
    assert next(iter(val))[0].tolist() == list(range(8))

def test_helpers_edge_cases():
    assert accuracy(torch.eye(3), torch.tensor([0, 1, 1])).item() == pytest.approx(2 / 3)
    assert mask2idxs([]) == [] and mask2idxs(np.array([True, True])) == [0, 1]
    assert str(PPDict(a=np.float32(0.123456), b=torch.tensor(2), t=timedelta(0))) == "{'a': 0.1235, 'b': tensor(2), 't': '0:00:00'}"
    with pytest.raises(FileNotFoundError): get_images('/no/such/folder')

def test_clean_traceback_without_an_exception():
    for name in ('last_type', 'last_value', 'last_traceback'):
        if hasattr(sys, name): delattr(sys, name)
    assert clean_traceback() is False
    assert clean_ipython_hist() is False
