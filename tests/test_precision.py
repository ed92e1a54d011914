"Mixed precision: bf16 accuracy on Fashion-MNIST, autocast never leaking, the float16 gradient scaler (unscaled gradients at the step, skipped inf/NaN steps), state."
import pytest
import torch
from torch import nn
from torcheval.metrics import MulticlassAccuracy

from aisaac.core.callback import Callback, CancelBatchException
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, load_fashion_mnist, pil_to_tensor, sample_dataset_dict
from aisaac.models import get_model_conv
from aisaac.utils import inplace
from aisaac.callbacks.train import BasicTrainCB, DeviceCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.schedule import OneCycleSchedulerCB
from aisaac.callbacks.precision import MixedPrecisionCB, MixedPrecision
from tiny import make_trainer

@inplace
def tfm(b): b['image'] = [(pil_to_tensor(o) - 0.28) / 0.35 for o in b['image']]

def test_bf16_accuracy_within_one_point_of_float32_on_fashion_mnist():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on two shared cores made this test 40x slower
    try: _bf16_accuracy()
    finally: torch.set_num_threads(threads)

def _bf16_accuracy():
    dls = DataLoaders.from_dataset_dict(sample_dataset_dict(load_fashion_mnist(), 4000, 1000).with_transform(tfm), 64, fast=True)
    def accuracy(*cbs):
        torch.manual_seed(1)
        t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.Adam, get_model_conv(),
                    callbacks=[DeviceCB('cpu'), BasicTrainCB(), MetricsCB(Accuracy=MulticlassAccuracy()), OneCycleSchedulerCB(), *cbs])
        t.fit(2, lr=1e-2)
        return t.MetricsCB.metrics_epoch[-1]['Accuracy'], t
    acc32, _ = accuracy()
    acc16, t = accuracy(MixedPrecisionCB())
    assert t.MixedPrecisionCB.amp_dtype == torch.bfloat16
    assert acc32 > 0.75 and abs(acc32 - acc16) < 0.01, (acc32, acc16)

class Probe(Callback):
    "Whether autocast is on, per event"
    def __init__(self): self.on = {}
    def run_event(self, event, trainer, **kwargs):
        if event in ('predict', 'get_loss', 'backward', 'step', 'after_batch', 'after_fit', 'before_batch'):
            self.on.setdefault(event, set()).add(torch.is_autocast_enabled('cpu'))

def test_autocast_only_around_forward_and_loss_in_training_and_validation():
    probe = Probe()
    make_trainer([MixedPrecisionCB(), probe]).fit(2)
    assert probe.on == {'before_batch': {False}, 'predict': {True}, 'get_loss': {True}, 'backward': {False}, 'step': {False},
                        'after_batch': {False}, 'after_fit': {False}}

@pytest.mark.parametrize('where, exc', [('predict', RuntimeError), ('after_predict', KeyboardInterrupt), ('get_loss', CancelBatchException)])
def test_autocast_never_leaks(where, exc):
    class Fail(Callback):
        order = 20
    setattr(Fail, where, lambda self, t: (_ for _ in ()).throw(exc('stop')))
    t = make_trainer([MixedPrecisionCB(), Fail()])
    if exc is CancelBatchException: t.fit(1)
    else:
        with pytest.raises(exc): t.fit(1)
    assert not torch.is_autocast_enabled('cpu')

def test_preds_and_loss_are_float32_for_metrics():
    seen = []
    class See(Callback):
        def after_batch(self, t): seen.append((t.preds.dtype, t.loss.dtype))
    make_trainer([MixedPrecisionCB(), See()]).fit(1)
    assert set(seen) == {(torch.float32, torch.float32)}

class Grads(Callback):
    "The first layer's gradient after backward and at the step (order 15: after MixedPrecisionCB's before_step)"
    order = 15
    def before_fit(self, t): self.after_backward_, self.at_step = [], []
    def after_backward(self, t): self.after_backward_.append(t.model.weight.grad.clone())
    def before_step(self, t): self.at_step.append(t.model.weight.grad.clone())

def test_float16_gradients_are_scaled_for_backward_and_true_at_the_step():
    g16, g32 = Grads(), Grads()
    mp, scale = MixedPrecisionCB(torch.float16), 256.  # (the default 2**16 overflows float16 on this toy problem: a skipped step)
    mp.load_state_dict({'scaler': {'scale': scale, 'growth_factor': 2., 'backoff_factor': 0.5, 'growth_interval': 2000, '_growth_tracker': 0}})
    t = make_trainer([mp, g16], n_train=(8,))
    t.fit(1, valid=False)
    make_trainer([g32], n_train=(8,)).fit(1, valid=False)
    assert mp.skipped == 0
    assert torch.allclose(g16.after_backward_[0] / scale, g32.after_backward_[0], rtol=1e-2, atol=1e-4)
    assert torch.allclose(g16.at_step[0], g32.at_step[0], rtol=1e-2, atol=1e-4)
    assert t.loss.dtype == torch.float32 and abs(t.loss.item()) < 100  # the loss is not scaled

def test_float16_skips_steps_with_nan_and_lowers_the_scale():
    class NanLoss(Callback):
        order = 5
        def after_loss(self, t):
            if t.batch_num in (1, 2): t.loss = t.loss * float('nan')
    w = []
    class Weights(Callback):
        def after_batch(self, t): w.append(t.model.weight.detach().clone())
    t = make_trainer([MixedPrecisionCB(torch.float16), NanLoss(), Weights()], n_train=(4,) * 5)
    t.fit(1, valid=False)
    mp = t.MixedPrecisionCB
    assert mp.skipped == 2 and mp.scaler.get_scale() == 2. ** 14
    assert torch.equal(w[0], w[1]) and torch.equal(w[1], w[2]) and not torch.equal(w[2], w[3])
    assert torch.isfinite(t.model.weight).all()

def test_scaler_state_for_checkpoints():
    t = make_trainer([MixedPrecisionCB(torch.float16)])
    t.fit(1)
    t.MixedPrecisionCB.scaler.update(1024.)
    state = t.callbacks_state_dict()['MixedPrecisionCB']
    cb = MixedPrecisionCB(torch.float16)
    cb.load_state_dict(state)
    assert cb.state_dict() == state
    make_trainer([cb]).fit(1, train=False)
    assert cb.scaler.get_scale() == 1024.
    assert MixedPrecisionCB().state_dict() == {}
    cb.load_state_dict({'scaler': state['scaler'] | {'scale': 8.}})  # between fits: for the next fit's new scaler
    make_trainer([cb]).fit(1, train=False)
    assert cb.scaler.get_scale() == 8.

def test_miniai_mixed_precision_trains_alone():
    def run(cbs):
        t = make_trainer([], n_train=(4,) * 5)
        t.remove_callbacks(t.BasicTrainCB)
        t.add_callbacks(cbs)
        t.fit(2, lr=0.1)
        return t.model.weight.detach().clone()
    assert torch.equal(run([MixedPrecision()]), run([BasicTrainCB(), MixedPrecisionCB()]))
    assert not torch.equal(run([MixedPrecision()]), run([BasicTrainCB()]))

def test_bad_dtype():
    with pytest.raises(ValueError, match='bfloat16 or torch.float16'): MixedPrecisionCB(torch.float32)

def test_two_autocast_callbacks_are_refused_before_they_leave_autocast_on_for_the_process():
    """Found by the invariance harness (issue 51: MixedPrecisionCB + MixedPrecision under `resume`, then every callback under `accumulation`
    differed by 1.7e-4, bfloat16's rounding): each callback entered `torch.autocast` in `before_predict` and closed it in `after_loss` in the
    same order, so the second one's exit put back the first one's autocast, which stayed on in the process after the fit"""
    from aisaac.invariants import tiny_trainer
    from aisaac.callbacks.precision import MixedPrecisionCB, MixedPrecision
    t = tiny_trainer([MixedPrecisionCB(), MixedPrecision()])
    with pytest.raises(ValueError, match='two MixedPrecisionCB'): t.fit(1)
    assert not torch.is_autocast_enabled('cpu')

@pytest.mark.parametrize('fast', [True, False])
def test_if_fast_autocasts_only_where_the_device_has_the_kernels_and_trains_as_float32_elsewhere(monkeypatch, fast):
    """On a CPU without bfloat16 kernels of its own (x86 without AVX-512: a small GPT trained 7-9 times slower in bfloat16 than in
    float32 on one), MixedPrecisionCB(if_fast=True) leaves autocast off: the run is float32's, bit for bit; where they exist it autocasts"""
    import aisaac.callbacks.precision as precision
    monkeypatch.setattr(precision, 'fast_autocast', lambda device_type, dtype=torch.bfloat16: fast)
    probe = Probe()
    t = make_trainer([MixedPrecisionCB(if_fast=True), probe]); t.fit(2)
    assert t.MixedPrecisionCB.active is fast and probe.on['predict'] == {fast}
    ref = make_trainer(); ref.fit(2)
    same = all(torch.equal(a, b) for a, b in zip(t.model.parameters(), ref.model.parameters()))
    assert same is not fast  # float32 exactly where it is slow; bfloat16's rounding where it is fast

def test_a_slow_autocast_is_warned_about_once_with_the_fix(monkeypatch):
    import aisaac.callbacks.precision as precision
    monkeypatch.setattr(precision, 'fast_autocast', lambda device_type, dtype=torch.bfloat16: False)
    monkeypatch.setattr(precision, '_warned', set())
    with pytest.warns(UserWarning, match=r'no bfloat16 kernels.*if_fast=True') as caught:
        for _ in range(2): make_trainer([MixedPrecisionCB()]).fit(1)
    assert sum('MixedPrecisionCB' in str(w.message) for w in caught) == 1
    monkeypatch.setattr(precision, '_warned', set())
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        make_trainer([MixedPrecisionCB(torch.float16)]).fit(1)  # float16 on a CPU is asked for by name, and gains little anyway
    assert not [w for w in caught if 'MixedPrecisionCB' in str(w.message)]

def test_fast_autocast_reads_the_machine():
    "float16 on a CPU is never fast; bfloat16 on a CPU is where oneDNN has its kernels (AVX-512 on x86)"
    from aisaac.callbacks.precision import fast_autocast
    assert fast_autocast('cpu', torch.float16) is False
    assert fast_autocast('cpu') is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
