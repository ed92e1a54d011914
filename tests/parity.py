"Helpers shared by the parity suites (not a test module): Fashion-MNIST samples, a recorder, figure counting."
import functools
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import pytest
import torch

from aisaac.core.callback import Callback
from aisaac.data import DataLoaders, load_fashion_mnist, sample_dataset_dict

@functools.lru_cache(None)
def fashion_mnist():
    "The notebooks' `load_dataset('fashion_mnist')`, read once per process"
    return load_fashion_mnist()

def sample(tfm, *sizes, **kwargs):
    "`sample_dataset_dict(fashion_mnist().with_transform(tfm), *sizes)`, seeded by `sample_dataset_dict`"
    return sample_dataset_dict(fashion_mnist().with_transform(tfm), *sizes, **kwargs)

def fast_dls(tfm, bs, n_train=500, n_valid=500):
    "`DataLoaders.from_dataset_dict` on a sample, through aisaac's in-memory loader (the training cases use it to stay fast)"
    return DataLoaders.from_dataset_dict(sample(tfm, n_train, n_valid), bs, fast=True)

class Record(Callback):
    "Record every event, in order, with the training flag (`run_event` sees all of them)"
    def __init__(self): self.log = []
    def run_event(self, event, trainer, **kwargs): self.log.append((event, getattr(trainer, 'model', None) is not None and trainer.model.training))
    def count(self, event, training=None): return sum(1 for e, t in self.log if e == event and (training is None or t == training))

class LRs(Callback):
    "The learning rate of the first param group at each training batch, before the step"
    order = -10
    def before_fit(self, trainer): self.lrs = []
    def before_step(self, trainer): self.lrs.append(trainer.opt.param_groups[0]['lr'])

def n_axes(fig=None):
    "The number of axes of `fig` (default: the current figure) that are shown: with their frame, or with an image or lines"
    fig = fig or plt.gcf()
    return sum(1 for ax in fig.axes if ax.axison or ax.images or ax.lines)

def params(model): return [p.detach().clone() for p in model.parameters()]
def same(a, b): return len(a) == len(b) and all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b))  # a trainer may have moved one to the GPU

@pytest.fixture(autouse=True, scope='module')
def one_thread():
    "One intra-op thread: under load on 2 shared cores a small conv net trains 20x faster this way"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

@pytest.fixture(autouse=True)
def fresh_state():
    "Close figures and undo `set_seed(..., deterministic=True)` after each case"
    yield
    plt.close('all')
    torch.use_deterministic_algorithms(False)
