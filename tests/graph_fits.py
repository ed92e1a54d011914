"Helpers shared by tests/test_graphs.py and the graph tests of tests/test_cuda.py (not a test module): small fits, with and without CUDAGraphCB"
import torch
from torch import nn
from aisaac.core.callback import Callback, CancelFitException
from aisaac.trainer import Trainer
import aisaac.checkpoint  # noqa: F401 (save_checkpoint, fit(resume_from=...))
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB

def data(n, seed, n_in=8, n_out=3):
    "A learnable classification problem: `x` drawn with `seed`, `y` the argmax of one fixed linear map of it"
    x = torch.randn(n, n_in, generator=torch.Generator().manual_seed(seed))
    return x, (x @ torch.randn(n_in, n_out, generator=torch.Generator().manual_seed(99))).argmax(1)

def mlp(n_in=8, n_out=3, p=0.): return nn.Sequential(nn.Linear(n_in, 32), nn.ReLU(), nn.Dropout(p), nn.Linear(32, n_out))

def tensor_dls(n=256, bs=32, device=None, drop_last=False):
    (x, y), (xv, yv) = data(n, 0), data(128, 1)
    return DataLoaders(TensorLoader(x, y, bs=bs, shuffle=True, seed=0, device=device, drop_last=drop_last), TensorLoader(xv, yv, bs=2 * bs, device=device))

def weights(model): return torch.cat([p.detach().float().flatten().cpu() for p in model.parameters()])

def make_trainer(*cbs, opt_func=torch.optim.Adam, dls=None, model=mlp, seed=0, device=None):
    "A seeded trainer: BasicTrainCB, MetricsCB (quiet) and `cbs`; `model` a module, or a function that makes it (after the seed)"
    torch.manual_seed(seed)
    model = (model if isinstance(model, nn.Module) else model()).to(device or 'cpu')
    return Trainer(dls or tensor_dls(device=device), nn.CrossEntropyLoss(), opt_func, model, callbacks=[BasicTrainCB(), MetricsCB(show=False), *cbs])

def fit(*cbs, n_epochs=4, lr=1e-2, **kwargs):
    "Fit `make_trainer(*cbs, **kwargs)`; the trainer and its weights"
    t = make_trainer(*cbs, **kwargs)
    t.fit(n_epochs, lr=lr)
    return t, weights(t.model)

class Losses(Callback):
    "Each training batch's loss, as `MetricsCB` keeps it (a view of the graph's ring in a replayed batch)"
    cuda_graph = 'host'
    def before_fit(self, t): self.losses = []
    def after_batch(self, t):
        if t.training: self.losses.append(t.loss.detach())
    def values(self): return torch.stack(self.losses).float().cpu()

class StopAt(Callback):
    "Save a checkpoint at `path` after training batch `batch` of `epoch`, then stop the fit"
    cuda_graph = 'host'
    def __init__(self, path, epoch, batch): self.path, self.epoch, self.batch = path, epoch, batch
    def checkpoint(self, t, at):
        if at == 'batch' and t.epoch == self.epoch and t.batch_num == self.batch:
            t.save_checkpoint(self.path)
            raise CancelFitException()
