"Two features that are exact alone and must stay exact together (issue 46): each test names the figure seen before its fix."
import pytest
import torch
from torch import nn

from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.gradients import MicroBatchCB

torch.manual_seed(0)
X, Y = torch.randn(32, 5), torch.randn(32, 2)

def _model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))

# ---- 1. MicroBatchCB and the trainer's clock

class Clocks(Callback):
    "The clock after each training batch, and the per-batch rows the loggers get"
    order = 200
    def before_fit(self, t): self.seen, self.logged = [], []
    def after_batch(self, t):
        if t.model.training: self.seen.append({k: v for k, v in t.clock.state_dict().items() if k != 'seconds'})
    def log(self, t, metrics, step, per):
        if per == 'batch': self.logged.append((sorted(metrics), step))

def _clock_fit(tmp_path, *cbs, name='a'):
    from aisaac.callbacks.savers import CheckpointCB, checkpoints
    from aisaac.callbacks.schedule import WarmupCosineSchedulerCB
    from aisaac.callbacks.monitors import LRMonitorCB, GradNormCB
    from aisaac.callbacks.metrics import MetricsCB
    clocks = Clocks()
    ckpt = CheckpointCB(tmp_path/name, every_n_epochs=None, every='16 samples', keep_last=None)
    t = Trainer(DataLoaders(TensorLoader(X, Y, bs=8), TensorLoader(X, Y, bs=8)), nn.MSELoss(), torch.optim.SGD, _model(),
                callbacks=[BasicTrainCB(), MetricsCB(), WarmupCosineSchedulerCB(warmup=2), LRMonitorCB(), GradNormCB(per_layer=False),
                           ckpt, clocks, *cbs])
    t.fit(1, lr=0.1, valid=False)
    return t, clocks, [p.name for p in checkpoints(tmp_path/name)]

def test_micro_batches_count_each_batch_once_on_the_clock(tmp_path):
    """4 steps of batch 8, each batch in 2 microbatches: the clock read micro_step 8 / samples 48 (each microbatch but the last
    counted again), where the same fit without MicroBatchCB reads 4 / 32; its `every='16 samples'` checkpoints, the loggers' batch
    rows and the schedule must be the fit's without microbatches"""
    ref, ref_clocks, ref_files = _clock_fit(tmp_path, name='ref')
    t, clocks, files = _clock_fit(tmp_path, MicroBatchCB(2), name='micro')
    assert (t.clock.micro_step, t.clock.samples, t.clock.step) == (ref.clock.micro_step, ref.clock.samples, ref.clock.step) == (4, 32, 4)
    assert clocks.seen == ref_clocks.seen
    assert files == ref_files and len(files) == 2
    assert clocks.logged == ref_clocks.logged
    assert [g['lr'] for g in t.opt.param_groups] == pytest.approx([g['lr'] for g in ref.opt.param_groups])
    names = ref.history.get_metric_names('batch')
    assert names and t.history.get_metric_names('batch') == names
    for k in names: assert t.history.get_metric_steps(k, per='batch') == ref.history.get_metric_steps(k, per='batch')
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(t.model.parameters(), ref.model.parameters()))
