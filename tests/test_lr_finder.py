"LR finder: the sweep, its stopping rule and suggestion, and the trainer put back bit for bit afterwards."
import math, random
from functools import partial
import numpy as np
import pytest
import torch
from torch import nn

from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.train import BasicTrainCB, DeviceCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.schedule import BatchSchedulerCB
from aisaac.callbacks.lr_finder import LRFinderCB

def make(seed=0):
    "A model with batchnorm (buffers) and dropout (draws random numbers), Adam, shuffled loaders on torch's global RNG"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g); y = (x[:, :2].sum(1) > 0).long()
    dls = DataLoaders(TensorLoader(x, y, bs=32, shuffle=True), TensorLoader(x[:64], y[:64], bs=32))
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
    sched = BatchSchedulerCB(partial(torch.optim.lr_scheduler.StepLR, step_size=3, gamma=0.9))
    return Trainer(dls, nn.CrossEntropyLoss(), torch.optim.Adam, model, callbacks=[DeviceCB('cpu'), BasicTrainCB(), MetricsCB(), sched])

def snapshot(t):
    m = t.model
    return dict(
        tensors=[(id(p), p.data_ptr(), p.detach().clone()) for p in [*m.parameters(), *m.buffers()]],
        grads=[None if p.grad is None else p.grad.clone() for p in m.parameters()],
        modes=[mod.training for mod in m.modules()],
        opt=(id(t.opt), t.opt.state_dict()),
        rng=(random.getstate(), np.random.get_state(), torch.get_rng_state()),
        cbs=[id(cb) for cb in t.cbs], names=sorted(k for k in vars(t) if not k.startswith('_')),
        attrs={k: getattr(t, k) for k in ('epoch', 'lr', 'n_epochs', 'do_train', 'do_valid', 'batch_num')},
        records=(list(t.MetricsCB.losses_batch), list(t.MetricsCB.losses_epoch)),
        sched=t.BatchSchedulerCB.scheduler.state_dict(), history=t.history.state_dict())

def same(a, b):
    "Bit for bit"
    if isinstance(a, torch.Tensor): return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray): return np.array_equal(a, b)
    if isinstance(a, dict): return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)): return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b

def test_lr_find_puts_everything_back_bit_for_bit():
    t = make()
    t.fit(1, lr=1e-2)
    t.model.eval()  # a mode the sweep changes
    random.seed(5); np.random.seed(5); torch.manual_seed(5)
    before, globals_before = snapshot(t), set(globals())
    finder = t.lr_find(start_lr=1e-5, max_epochs=4, plot=False)
    assert len(finder.lrs) > 10
    after = snapshot(t)
    for k in before: assert same(before[k], after[k]), k
    assert set(globals()) == globals_before
    assert not t.off

def test_what_comes_after_lr_find_is_what_would_have_come_without_it():
    a, b = make(), make()
    torch.manual_seed(3); a.fit(1, lr=1e-2); a.lr_find(max_epochs=2, plot=False); a.fit(1, lr=1e-2)
    torch.manual_seed(3); b.fit(1, lr=1e-2); b.fit(1, lr=1e-2)
    assert all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    assert same(a.MetricsCB.losses_epoch, b.MetricsCB.losses_epoch)

def test_lr_find_restores_after_an_error_in_the_sweep():
    class Boom(Callback):
        def before_step(self, t):
            if t.batch_num == 3: raise RuntimeError('boom')
    t = make(); t.fit(1, lr=1e-2)
    before = snapshot(t)
    t.add_callbacks(Boom())
    with pytest.raises(RuntimeError, match='boom'): t.lr_find(plot=False)
    t.remove_callbacks(t.Boom)
    after = snapshot(t)
    for k in before: assert same(before[k], after[k]), k

def test_the_sweep_grows_the_lr_by_gamma_and_stops_when_the_loss_explodes():
    t = make()
    f = t.lr_find(start_lr=1e-4, gamma=1.5, max_mult=2, plot=False)
    assert f.lrs == pytest.approx([1e-4 * 1.5 ** i for i in range(len(f.lrs))])
    last = f.losses[-1]
    assert not math.isfinite(last) or last > 2 * min(f.losses[:-1])
    assert all(l <= 2 * min(f.losses[:i + 1]) for i, l in enumerate(f.losses[:-1]))

def test_max_epochs_bounds_a_sweep_that_never_explodes():
    class Flat(Callback):  # a loss that never grows: the sweep runs to the end
        order = 1
        def after_loss(self, t): t.loss = t.loss * 0 + 1.0
    t = make()
    t.add_callbacks(Flat())
    f = t.lr_find(max_epochs=2, plot=False)
    assert len(f.lrs) == 2 * 8

def test_in_a_plain_fit_the_fits_optimizer_is_reset_and_validation_skipped():
    t = make()
    seen = []
    class Count(Callback):
        during_lr_find = True
        def after_batch(self, t): seen.append(t.model.training)
    f = LRFinderCB(plot=False)
    t.fit(2, lr=1e-4, callbacks=[f, Count()])
    assert f.lrs[0] == 1e-4 and all(seen)
    assert t.opt.state_dict()['state'] == {} and t.opt.param_groups[0]['lr'] == 1e-4
    assert 'initial_lr' not in t.opt.param_groups[0]

def test_only_batch_work_runs_during_the_sweep():
    calls = []
    class Watcher(Callback):
        def after_batch(self, t): calls.append('watch')
    class Tfm(Callback):
        def before_batch(self, t): calls.append('tfm')
    class Says(Callback):
        during_lr_find = False
        def predict(self, t): calls.append('says')
    t = make()
    t.add_callbacks([Watcher(), Tfm(), Says()])
    t.lr_find(max_epochs=1, plot=False)
    assert set(calls) == {'tfm'}
    assert t.BatchSchedulerCB.scheduler is None  # the trainer's scheduler callback did not even start

def test_suggestion_is_the_steepest_descent_before_the_minimum():
    f = LRFinderCB(plot=False)
    f.lrs = list(10 ** np.linspace(-6, 0, 61))
    f.losses = [2 - math.tanh(2 * (math.log10(lr) + 3)) + (8 * (math.log10(lr) + 0.5) ** 2 if lr > 10 ** -0.5 else 0) for lr in f.lrs]
    assert f.suggestion == pytest.approx(1e-3, rel=0.13)
    assert 10 ** -1 < f.lr_min < 1
    f.losses[-1] = float('nan')  # a non-finite last loss is left out
    assert f.suggestion == pytest.approx(1e-3, rel=0.13)

def test_plot_marks_the_suggestion_and_labels_the_axes():
    import matplotlib; matplotlib.use('Agg')
    t = make()
    f = t.lr_find(start_lr=1e-5, plot=False)
    ax = f.plot()
    assert ax.get_xscale() == 'log' and 'learning rate' in ax.get_xlabel().lower() and ax.get_ylabel() == 'loss'
    assert any('steepest descent' in tx.get_text() for tx in ax.get_legend().get_texts())

def test_plot_has_aisaacs_title_x_label_and_size():
    "AIsaac's LR finder plot: 'Learning Rate Finder', x axis 'Learning Rate' (log scale), a 12x4 inch figure"
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    f = make().lr_find(start_lr=1e-5, plot=False)
    ax = f.plot()
    try:
        assert (ax.get_title(), ax.get_xlabel(), ax.get_xscale()) == ('Learning Rate Finder', 'Learning Rate', 'log')
        assert tuple(ax.figure.get_size_inches()) == (12, 4)
    finally: plt.close(ax.figure)

def test_miniai_and_aisaac_arguments():
    assert LRFinderCB(gamma=1.1).lr_mult == 1.1 and LRFinderCB(1.2).lr_mult == 1.2 and LRFinderCB().lr_mult == 1.3
    with pytest.raises(ValueError, match='lr_mult must be > 1'): LRFinderCB(lr_mult=1)
    with pytest.raises(ValueError, match='max_mult must be > 1'): LRFinderCB(max_mult=0.5)

def test_under_gradient_accumulation_a_point_is_an_applied_step():
    "With `GradAccumCB(2)` a point is an optimizer step: its rate (grown by gamma per step, as Lightning's finder does), the mean loss of its window (before: a point per batch, the rate grown in the middle of a window, half the points without a step)"
    from aisaac.callbacks.gradients import GradAccumCB
    losses = []  # outside the callback: `lr_find` puts its callbacks' attributes back
    class Losses(Callback):
        during_lr_find = True
        def after_loss(self, t): losses.append(t.loss.item())
    t = make()
    t.add_callbacks([GradAccumCB(2), Losses()])
    f = t.lr_find(start_lr=1e-4, gamma=1.5, max_epochs=1, max_mult=1e9, plot=False)
    assert len(f.lrs) == 8 // 2 and f.lrs == pytest.approx([1e-4 * 1.5 ** i for i in range(4)])
    assert f.losses == pytest.approx([(a + b) / 2 for a, b in zip(losses[::2], losses[1::2])])
