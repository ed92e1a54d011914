"Hooks and activation statistics: removed after every kind of fit, one series per hooked module and batch, the numbers of a hand computation, no host sync"
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn
from fastcore.basics import risinstance
from aisaac.core.callback import Callback, CancelFitException, CancelEpochException
from aisaac.models import get_model_conv
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.hooks import Hook, Hooks, HooksCallback, ActivationStatsCB, append_stats, get_hist, get_min


def image_dls(n_train=(16, 16, 8), n_valid=(16,), seed=0):
    "Batches of random 28x28 images and 10 classes"
    g = torch.Generator().manual_seed(seed)
    mk = lambda sizes: [(torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)) for n in sizes]
    return type('DLs', (), {'train': mk(n_train), 'valid': mk(n_valid)})()


def conv_trainer(*cbs):
    torch.manual_seed(0)
    return Trainer(image_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, get_model_conv(), callbacks=[BasicTrainCB(), *cbs])


def n_hooks(model): return sum(len(m._forward_hooks) for m in model.modules())


def test_one_series_per_hooked_module_and_training_batch():
    stats = ActivationStatsCB(risinstance(nn.Conv2d))
    t = conv_trainer(stats)
    t.fit(2, lr=0.01)
    assert len(stats) == 5 == sum(isinstance(m, nn.Conv2d) for m in t.model.modules())
    for h in stats:
        assert [len(s) for s in h.stats] == [6, 6, 6]  # 2 epochs x 3 training batches; validation not hooked
        assert get_hist(h).shape == (40, 6) and get_min(h).shape == (6,)


def test_on_valid_adds_the_validation_batches():
    cb = HooksCallback(append_stats, risinstance(nn.ReLU), on_train=False, on_valid=True)
    t = conv_trainer(cb)
    t.fit(2, lr=0.01)
    assert [len(h.stats[0]) for h in cb] == [2] * 4


def test_default_filter_hooks_every_module_and_a_new_fit_starts_new_series():
    stats = ActivationStatsCB()
    t = conv_trainer(stats)
    t.fit(1, lr=0.01)
    assert len(stats) == len(list(t.model.modules())) == 16  # get_model_conv: 5 conv blocks (each a Sequential, the last without activation), their parts, Flatten, the model
    t.fit(1, lr=0.01)
    assert {len(h.stats[0]) for h in stats} == {3}


class ByHand(Callback):
    "The outputs of the model's first conv block, computed outside the hooks, before each training step"
    def before_fit(self, trainer): self.outs = []
    def after_predict(self, trainer):
        if trainer.training:
            with torch.no_grad(): self.outs.append(torch.relu(trainer.model[0][0](trainer.batch[0])))


def test_values_equal_a_hand_computation():
    stats, by_hand = ActivationStatsCB(lambda m: m is first_relu), ByHand()
    t = conv_trainer(stats, by_hand)
    first_relu = t.model[0][1]
    t.fit(2, lr=0.1)
    (h,) = stats
    assert h.name == '0.1: ReLU'
    outs = by_hand.outs
    torch.testing.assert_close(torch.stack(h.stats[0]), torch.stack([o.mean() for o in outs]))
    torch.testing.assert_close(torch.stack(h.stats[1]), torch.stack([o.std() for o in outs]))
    hists = torch.stack([torch.histogram(o.abs().flatten(), bins=40, range=(0., 10.)).hist for o in outs])
    torch.testing.assert_close(torch.stack(h.stats[2]), hists)
    torch.testing.assert_close(get_min(h), torch.stack([(o.abs() < 0.25).float().mean() for o in outs]))
    torch.testing.assert_close(get_hist(h), hists.t().log1p())


class CancelAfter(Callback):
    def __init__(self, exc): self.exc = exc
    def after_batch(self, trainer): raise self.exc


@pytest.mark.parametrize('exc', [CancelFitException(), CancelEpochException(), RuntimeError('boom'), KeyboardInterrupt()])
def test_hooks_are_gone_after_a_cancelled_or_failed_fit(exc):
    stats = ActivationStatsCB()
    t = conv_trainer(stats)
    if isinstance(exc, (RuntimeError, KeyboardInterrupt)):
        with pytest.raises(type(exc)): t.fit(1, callbacks=CancelAfter(exc))
    else: t.fit(1, callbacks=CancelAfter(exc))
    assert n_hooks(t.model) == 0
    assert all(h.handle is None for h in stats)
    assert len(stats[0].stats[0]) == 1  # the batch before the exception was recorded


def test_hooks_are_gone_when_another_callbacks_before_fit_fails():
    class FailAtStart(Callback):
        order = 5  # after ActivationStatsCB's before_fit has hooked the model
        def before_fit(self, trainer): raise ValueError('bad config')
    t = conv_trainer(ActivationStatsCB(), FailAtStart())
    with pytest.raises(ValueError, match='bad config'): t.fit(1)
    assert n_hooks(t.model) == 0


def test_hook_and_hooks_remove_on_exception_and_twice_is_harmless():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    with pytest.raises(RuntimeError):
        with Hooks(model, append_stats) as hs:
            model(torch.randn(4, 2))
            raise RuntimeError
    assert n_hooks(model) == 0 and [len(h.stats[0]) for h in hs] == [1, 1]
    hs.remove()
    with Hook(model[0], append_stats) as h: model(torch.randn(4, 2))
    h.remove()
    assert n_hooks(model) == 0 and len(h.stats[0]) == 1


def test_statistics_stay_on_the_device_no_host_reads_during_the_fit(monkeypatch):
    "Nothing in the hooks reads a tensor on the host: item, tolist, cpu, numpy and float() are forbidden during the fit"
    stats = ActivationStatsCB()
    t = conv_trainer(stats)
    def forbidden(*args, **kwargs): raise AssertionError('host read during the fit')
    with monkeypatch.context() as m:
        for name in ('item', 'tolist', 'cpu', 'numpy', '__float__'): m.setattr(torch.Tensor, name, forbidden)
        t.fit(1, lr=0.01)
    assert all(isinstance(v, torch.Tensor) for h in stats for s in h.stats for v in s)


def test_plots_have_one_panel_per_hooked_module_with_titles_and_labels():
    stats = ActivationStatsCB()
    t = conv_trainer(stats)
    t.fit(1, lr=0.01)
    for plot in (stats.color_dim, stats.dead_chart):
        plot()
        fig = plt.gcf()
        panels = [ax for ax in fig.axes if ax.axison]
        assert len(panels) == 16
        assert [ax.get_title() for ax in panels] == [h.name for h in stats]
        assert fig._supxlabel.get_text() == 'training batch' and fig._supylabel.get_text()
        plt.close(fig)
    stats.plot_stats()
    fig = plt.gcf()
    assert [ax.get_xlabel() for ax in fig.axes] == ['training batch'] * 2
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [h.name for h in stats]
    assert all(len(ax.lines) == 16 for ax in fig.axes)
    plt.close(fig)


def test_plots_have_aisaacs_sizes_and_panel_titles():
    "AIsaac's figure sizes: color_dim 11x6, dead_chart 11x5, plot_stats 10x4; the stats panels titled 'Means' and 'Stdevs'"
    stats = ActivationStatsCB(risinstance(nn.Conv2d))
    conv_trainer(stats).fit(1, lr=0.01)
    for plot, size in ((stats.color_dim, (11, 6)), (stats.dead_chart, (11, 5)), (stats.plot_stats, (10, 4))):
        plot()
        fig = plt.gcf()
        assert tuple(fig.get_size_inches()) == size, plot.__name__
        if plot == stats.plot_stats:
            assert [ax.get_title() for ax in fig.axes] == ['Means', 'Stdevs']
            assert [ax.get_ylabel() for ax in fig.axes] == ['mean', 'standard deviation']
        plt.close(fig)


def test_corecbs_keeps_activation_stats_and_rejects_what_is_not_a_metric():
    from torcheval.metrics import MulticlassAccuracy
    from aisaac.groups import CoreCBs
    torch.manual_seed(0)
    t = Trainer(image_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, get_model_conv(),
                callbacks=CoreCBs('cpu', risinstance(nn.ReLU), progress=False, Accuracy=MulticlassAccuracy()))
    t.fit(1, lr=0.01)
    assert [len(h.stats[0]) for h in t.ActivationStatsCB] == [3] * 4
    assert n_hooks(t.model) == 0
    assert 'Accuracy' in t.MetricsCB.metrics_epoch[-1]
    with pytest.raises(TypeError, match=r"lr=0\.1, which is not a metric"): CoreCBs(lr=0.1)
    with pytest.raises(TypeError, match="pass an instance"): CoreCBs(acc=MulticlassAccuracy)


def test_on_valid_hooks_the_validation_set_not_the_evaluation_sets():
    "An evaluation set of 3 batches after the validation set's 1: `on_valid` hooks the validation set's batch only (before: 4 per epoch, the evaluation set's mixed in)"
    from aisaac.evals import EvalSetsCB
    cb = HooksCallback(append_stats, risinstance(nn.ReLU), on_train=False, on_valid=True)
    from aisaac.callbacks.metrics import MetricsCB
    t = conv_trainer(cb, MetricsCB(show=False), EvalSetsCB(other=image_dls(n_valid=(16, 16, 16), seed=1).valid))
    t.fit(2, lr=0.01)
    assert [len(h.stats[0]) for h in cb] == [2] * 4
