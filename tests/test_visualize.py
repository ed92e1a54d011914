"Model summary, peek_batch, image batches and ImageVisualizerCB: numbers, no side effects, PNG size and titles"
import copy, random
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from aisaac.callback import Callback
from aisaac.data import DataLoaders, TensorLoader
from aisaac.models import get_model_conv
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB, DeviceCB
from aisaac.callbacks.summary import ModelSummary


def image_dls(n=48, bs=16, seed=0, loader='torch'):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    if loader == 'tensor': return DataLoaders(TensorLoader(x, y, bs=bs, shuffle=True, seed=1), TensorLoader(x, y, bs=bs))
    return DataLoaders(DataLoader(TensorDataset(x, y), bs, shuffle=True), DataLoader(TensorDataset(x, y), bs))


def bn_model():
    return nn.Sequential(nn.Conv2d(1, 4, 3, 2, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(), nn.Linear(4*14*14, 10))


class Counter(Callback):
    "Counts the events a metrics-like callback would see"
    def before_fit(self, trainer): self.fits = getattr(self, 'fits', 0) + 1
    def after_batch(self, trainer): self.batches = getattr(self, 'batches', 0) + 1


def trained(loader='torch', seed=0, model=bn_model):
    torch.manual_seed(seed)
    t = Trainer(image_dls(loader=loader), nn.CrossEntropyLoss(), torch.optim.Adam, model(),
                callbacks=[BasicTrainCB(), DeviceCB('cpu'), Counter()])
    t.fit(1, lr=1e-3)
    return t


def snapshot(t):
    return (copy.deepcopy(t.model.state_dict()), copy.deepcopy(t.opt.state_dict()), torch.get_rng_state(),
            random.getstate(), np.random.get_state()[1].copy(), t.model.training, t.epoch, t.opt)


def assert_same(a, b):
    for k in a[0]: assert torch.equal(a[0][k], b[0][k]), k  # weights and batch-norm buffers
    assert str(a[1]) == str(b[1])  # optimizer state
    assert torch.equal(a[2], b[2]) and a[3] == b[3] and (a[4] == b[4]).all()  # torch, Python and NumPy random states
    assert a[5:] == b[5:]  # model mode, the trainer's counters, the same optimizer object


@pytest.mark.parametrize('loader', ['torch', 'tensor'])
def test_summary_trains_nothing_and_leaves_the_random_state(loader):
    t = trained(loader)
    before = snapshot(t)
    s = t.summarize_model()
    assert_same(before, snapshot(t))
    assert t.Counter.fits == 1 and t.Counter.batches == 3 + 3  # the summary's batch reached no other callback
    assert sum(len(m._forward_hooks) for m in t.model.modules()) == 0
    assert isinstance(s, ModelSummary)


@pytest.mark.parametrize('loader', ['torch', 'tensor'])
def test_a_fit_after_a_summary_is_the_fit_without_it(loader):
    "The shuffled loaders draw the same batches: the summary consumed no randomness"
    a, b = trained(loader), trained(loader)
    b.summary(); b.peek_batch(); b.peek_batch(train=False)
    torch.manual_seed(5); a.fit(1); torch.manual_seed(5); b.fit(1)
    for k, v in a.model.state_dict().items(): assert torch.equal(v, b.model.state_dict()[k]), k


def test_summary_numbers_on_a_linear_model():
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    t = Trainer(DataLoaders([(x, y)], [(x, y)]), nn.MSELoss(), torch.optim.SGD,
                nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 3, bias=False))), callbacks=[BasicTrainCB()])
    t.model[0].weight.requires_grad_(False)
    s = t.summarize_model()
    assert [r[0].strip() for r in s] == ['0 Linear', '1 ReLU', '2 Sequential', '2.0 Linear']
    assert [r[1:4] for r in s] == [((5, 4), (5, 8), '40'), ((5, 8), (5, 8), '0'), ((5, 8), (5, 3), '24'), ((5, 8), (5, 3), '24')]
    assert [r[4] for r in s] == [f'{2*5*4*8/1e6:.2f}', '0.00', f'{2*5*8*3/1e6:.2f}', f'{2*5*8*3/1e6:.2f}']
    assert (s.params, s.trainable, s.flops) == (40 + 24, 8 + 24, 2*5*4*8 + 2*5*8*3)
    assert len(t.summarize_model(depth=1)) == 3
    text, md = repr(s), s._repr_markdown_()
    assert text.splitlines()[0].split() == ['module', 'input', 'output', 'params', 'MFLOPs']
    assert 'Total params: 64 (32 trainable); MFLOPs per batch: 0.0' in text and text == str(s)
    assert md.splitlines()[:2] == ['| module | input | output | params | MFLOPs |', '| --- | --- | --- | --- | --- |']
    assert '| 2.0 Linear | (5, 8) | (5, 3) | 24 | 0.00 |' in md.replace('|   2.0', '| 2.0')


def test_peek_batch_runs_only_the_callbacks_that_prepare_batches():
    class Scale(Callback):
        def after_dataloader(self, trainer): trainer.batch = (trainer.batch[0] * 3, trainer.batch[1])
    t = trained()
    t.add_callbacks(Scale())
    with torch.random.fork_rng(): first = next(iter(t.dls.valid))
    xb, yb = t.peek_batch(train=False)
    assert torch.equal(xb, first[0] * 3) and torch.equal(yb, first[1])
    assert t.Counter.fits == 1
    t.dls = DataLoaders([], [])
    with pytest.raises(ValueError, match='training loader gave no batch'): t.peek_batch()
