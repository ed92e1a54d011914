"""Sub-runs as transactions: `trainer.transaction()` and the tools that run inside one (lr_find, peek_batch, show_image_batch,
summarize_model, capture_preds) leave weights, optimizer, callbacks' state, history, clock and random draws bit-identical."""
import copy, random
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import numpy as np
import pytest, torch
from torch import nn
from torcheval.metrics import MulticlassAccuracy
from aisaac.data import DataLoaders, TensorLoader
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.schedule import OneCycleSchedulerCB
from aisaac.callbacks.augment import BatchAugmentationCB, RandErase
from aisaac.core.callback import Callback
import aisaac.checkpoint, aisaac.callbacks.lr_finder, aisaac.callbacks.summary, aisaac.callbacks.visualize, aisaac.callbacks.preds  # noqa

def make():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(192, 1, 8, 8, generator=g); y = (x.mean((1, 2, 3)) > 0).long()
    dls = DataLoaders(TensorLoader(x, y, bs=32, shuffle=True), TensorLoader(x[:64], y[:64], bs=32))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.2), nn.Flatten(), nn.Linear(256, 2))
    t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.Adam, model,
                callbacks=[BasicTrainCB(), MetricsCB(acc=MulticlassAccuracy(), show=False), OneCycleSchedulerCB(),
                           BatchAugmentationCB(RandErase(), on_valid=False)])
    t.fit(1, lr=1e-2)  # an optimizer with state, a history, a clock, metrics' records
    return t

def everything(t):
    "The state a sub-run must not change, and the next random draws (put back afterwards)"
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    draws = (random.random(), float(np.random.rand()), torch.rand(3))
    random.setstate(states[0]); np.random.set_state(states[1]); torch.set_rng_state(states[2])
    return copy.deepcopy({'model': t.model.state_dict(), 'opt': t.opt.state_dict(),
            'callbacks': t.callbacks_state_dict(), 'history': t.history.state_dict(), 'clock': t.clock.state_dict(),
            'resume': t.resume_point(), 'names': sorted(vars(t)), 'draws': draws,
            'loaders': [t.dls.train.state_dict(), t.dls.valid.state_dict()]})  # where each is in its epoch: the next checkpoint holds it

def same(a, b):
    if isinstance(a, torch.Tensor): return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray): return np.array_equal(a, b)
    if isinstance(a, dict): return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)): return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b

TOOLS = {'lr_find': lambda t: t.lr_find(plot=False, max_epochs=2),
         'peek_batch': lambda t: t.peek_batch(),
         'show_image_batch': lambda t: t.show_image_batch(4),
         'summarize_model': lambda t: t.summarize_model(),
         'capture_preds': lambda t: t.capture_preds()}

@pytest.mark.parametrize('tool', TOOLS)
def test_each_tool_leaves_the_run_bit_identical(tool):
    t = make()
    before = everything(t)
    TOOLS[tool](t)
    plt.close('all')
    after = everything(t)
    for k in before:
        if tool == 'show_image_batch' and k == 'names': assert set(after[k]) - set(before[k]) <= {'batch'}; continue  # miniai's learn.batch
        assert same(before[k], after[k]), k

def test_a_transaction_puts_back_a_sub_run_that_trained_and_raised():
    t = make()
    before = everything(t)
    with pytest.raises(RuntimeError, match='inside'):
        with t.transaction():
            t.fit(2, lr=0.5)
            t.extra = 1
            raise RuntimeError('inside')
    after = everything(t)
    for k in before: assert same(before[k], after[k]), k
    assert not hasattr(t, 'extra')
    t.fit(1, lr=1e-2)  # the next fit continues as it would have: one cycle from the start, the clock going on
    assert t.clock.step == 12 and t.history.get_metric_steps('train_loss') == [0, 1]

def test_a_transaction_puts_back_gradients_and_each_modules_mode():
    "Gradients left between backward and step, and a module kept in eval mode (a frozen BatchNorm), are as they were"
    t = make()
    xb, yb = next(iter(t.dls.train))
    t.loss_func(t.model(xb), yb).backward()
    t.model.train(); t.model[1].eval()  # the BatchNorm frozen, the rest training
    grads, modes = [p.grad.clone() for p in t.model.parameters()], [m.training for m in t.model.modules()]
    t.lr_find(plot=False, max_epochs=1)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, t.model.parameters()))
    assert [m.training for m in t.model.modules()] == modes and modes[:3] == [True, True, False]

class _Counts(Callback):
    "A callback with plain attributes and no `state_dict`: what it counts in a sub-run must not stay"
    during_lr_find = True
    def __init__(self): self.batches, self.fits, self.seen = 0, 0, []
    def before_fit(self, t): self.fits += 1; self.last_lr = t.lr
    def after_batch(self, t): self.batches += 1; self.seen.append(t.training)

@pytest.mark.parametrize('tool', ['lr_find', 'capture_preds', 'interpretation'])
def test_each_tool_puts_back_the_plain_attributes_of_callbacks_without_a_state(tool):
    "Before: the transaction copied the attributes of callbacks with a non-empty `state_dict` only: a counter of batches read 20 after `lr_find` and 10 after `capture_preds` or `Interpretation.from_trainer`, where it was 8 (fits 2, not 1; its `last_lr` the sub-run's)"
    from aisaac.callbacks.interpret import Interpretation
    t = make()
    c = _Counts()
    t.add_callbacks([c])
    t.fit(1, lr=1e-2)
    before = copy.deepcopy(vars(c))
    {'lr_find': lambda: t.lr_find(plot=False, max_epochs=2), 'capture_preds': lambda: t.capture_preds(),
     'interpretation': lambda: Interpretation.from_trainer(t)}[tool]()
    assert vars(c) == before

def test_a_callback_kept_out_of_the_sweep_is_not_entered_at_all():
    "A callback that declares `during_lr_find=False` runs no handler of the sweep, `around_fit` included. Before: a profiler (`ProfileCB`, `around_fit` at order 0, below `LRFinderCB`'s 100) profiled the sweep: its `stats` after `lr_find` were the sweep's"
    from aisaac.callbacks.introspect import ProfileCB
    entered = []
    class Around(Callback):
        during_lr_find = False
        def around_fit(self, t): entered.append(t.lr); yield
    t = make()
    t.add_callbacks([Around(), p := ProfileCB()])
    t.fit(1, lr=1e-2)
    stats, n = copy.deepcopy(p.stats), len(entered)
    t.lr_find(plot=False, max_epochs=1)
    assert len(entered) == n == 1
    assert p.stats == stats

def test_a_callback_holding_the_models_layers_holds_the_same_layers_after_a_tool():
    """Attributes that are the model's layers, parameters or hook handles are kept, not copied: a hook recorder still records the live model
    after `lr_find` and `capture_preds`. Before (once every callback's attributes were copied): the callback's layer, weight and handle
    after `lr_find` were deep copies, not the model's"""
    class Holds(Callback):
        def __init__(self): self.layer, self.seen = None, []
        def before_fit(self, t):
            if self.layer is None: self.layer, self.weight = t.model[0], t.model[0].weight; self.handle = t.model[0].register_forward_hook(lambda m, i, o: self.seen.append(1))
    t = make()
    t.add_callbacks([h := Holds()])
    t.fit(1, lr=1e-2)
    layer, weight, handle = h.layer, h.weight, h.handle
    t.lr_find(plot=False, max_epochs=1); t.capture_preds()
    assert h.layer is layer is t.model[0] and h.weight is weight is t.model[0].weight and h.handle is handle
    n = len(h.seen)
    t.model(torch.randn(2, 1, 8, 8))
    assert len(h.seen) == n + 1

def test_a_tool_puts_the_loaders_back_in_their_epoch_and_lossspikecbs_next_snapshot_is_the_straight_ones():
    """Found by the invariance harness (issue 51: LossSpikeCB + CheckpointCB under `transactions`): a sub-run drew batches from the
    trainer's loaders, and the transaction put back their generators but not their place in the epoch, so the next fit's first
    rollback snapshot (in its checkpoints) held the sub-run's place: after peek_batch 1 batch drawn against the 6 of the last epoch,
    after lr_find and summarize_model another generator state. Now the transaction puts the loaders' places back (`loader_places`)"""
    from aisaac.coverage import check
    assert check(['LossSpikeCB', 'CheckpointCB'], 'transactions') == []

def test_a_tool_puts_a_token_shard_loader_back_in_its_epoch(tmp_path):
    "The token-shard loader names its place (`_place_attrs`) too: after each tool its state is the last epoch's end, as without it"
    from aisaac.shards import ShardLoader, write_token_shards
    shards = write_token_shards([np.arange(4000) % 50], tmp_path/'shards', vocab_size=50, shard_tokens=1000)
    tfm = lambda b: (b[0][:, :-1].float() / 50, b[0][:, -1] % 3)
    dl = ShardLoader(shards, block_size=16, bs=4, shuffle=True, seed=0, batches=5, tfm=tfm)
    torch.manual_seed(0)
    t = Trainer(DataLoaders(dl, ShardLoader(shards, block_size=16, bs=4, tfm=tfm)), nn.CrossEntropyLoss(), torch.optim.SGD,
                nn.Linear(16, 3), callbacks=[BasicTrainCB()])
    t.fit(1, lr=0.1)
    for tool in ('peek_batch', 'summarize_model', 'lr_find'):
        before = everything(t)
        TOOLS[tool](t); plt.close('all')
        assert same(before, everything(t)), tool
        assert dl.state_dict()['batches'] == 5, tool
