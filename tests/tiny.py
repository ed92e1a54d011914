"Helpers shared by the tests (not a test module): tiny synthetic loaders and a trainer on them."
import types
import torch
from torch import nn

from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB

def make_dls(n_train=(3, 3), n_valid=(2,), n_in=2, n_out=1, seed=0):
    "Tiny synthetic loaders: lists of (x, y) batches of the given sizes"
    g = torch.Generator().manual_seed(seed)
    mk = lambda sizes: [(torch.randn(n, n_in, generator=g), torch.randn(n, n_out, generator=g)) for n in sizes]
    return types.SimpleNamespace(train=mk(n_train), valid=mk(n_valid))

def make_trainer(callbacks=(), dls=None, cls=Trainer, opt_func=torch.optim.SGD, model=None, **kw):
    "A `cls` with `BasicTrainCB` and `callbacks`, training `model` (default `nn.Linear(2, 1)`) on `dls` (default `make_dls(**kw)`), seeded"
    torch.manual_seed(0)
    return cls(dls or make_dls(**kw), nn.MSELoss(), opt_func, model=model or nn.Linear(2, 1),
               callbacks=[BasicTrainCB(), *(callbacks or ())])

class Script(Callback):
    "Records `values[name][epoch]` in the history at each epoch's checkpoint: a metric's values scripted, for the stoppers"
    def __init__(self, **values): self.values = values
    def checkpoint(self, t, at):
        if at == 'epoch':
            for name, vs in self.values.items(): t.history.update_metric(name, vs[t.epoch])

class Epochs(Callback):
    "Counts the epochs of a fit (their checkpoints)"
    def before_fit(self, t): self.n = 0
    def checkpoint(self, t, at): self.n += at == 'epoch'

def fastai_one_cycle(total, lr_max, pct_start, div=25., div_final=1e5, moms=(0.95, 0.85, 0.95)):
    "fastai's `fit_one_cycle` written out: before step i (of `total`) the position is i / total, and the rate (momentum) is a cosine from `lr_max/div` up to `lr_max` over the first `pct_start` of the positions, then down to `lr_max/div_final`; `(rates, momentums)`"
    import math
    def cos(start, end, pos): return start + (1 + math.cos(math.pi * (1 - pos))) * (end - start) / 2
    def at(pos, start, middle, end):
        return cos(start, middle, pos / pct_start) if pos < pct_start else cos(middle, end, (pos - pct_start) / (1 - pct_start))
    return ([at(i / total, lr_max / div, lr_max, lr_max / div_final) for i in range(total)], [at(i / total, *moms) for i in range(total)])
