"Gradient accumulation (GradAccumCB, MicroBatchCB) gives the large batch's gradients; clipping caps the true (unscaled) norm; errors."
import pytest
import torch
from torch import nn
from torcheval.metrics import MulticlassAccuracy

from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.callbacks.gradients import GradAccumCB, MicroBatchCB, GradClipCB

torch.manual_seed(0)
X, Y, C = torch.randn(64, 5), torch.randn(64, 2), torch.randint(0, 3, (64,))

class Grads(Callback):
    "All gradients as one vector at each optimizer step (order 50: after every other before_step)"
    order = 50
    def before_fit(self, t): self.at_step = []
    def before_step(self, t): self.at_step.append(torch.cat([p.grad.flatten() for p in t.model.parameters()]))

def fit(bs, *cbs, n=64, epochs=1, classify=False, model=None, opt=torch.optim.SGD):
    y = C if classify else Y
    torch.manual_seed(1)
    model = model or nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3 if classify else 2))
    grads = Grads()
    loss = nn.CrossEntropyLoss() if classify else nn.MSELoss()
    t = Trainer(DataLoaders(TensorLoader(X[:n], y[:n], bs=bs), TensorLoader(X[:n], y[:n], bs=bs)), loss, opt, model,
                callbacks=[BasicTrainCB(), grads, *cbs])
    t.fit(epochs, lr=0.1, valid=False)
    return grads.at_step, t

def close(a, b, tol=1e-6): return torch.allclose(a, b, atol=tol, rtol=tol)

@pytest.mark.parametrize('bs, n', [(16, 4), (8, 8), (32, 2)])
def test_grad_accum_gives_the_large_batch_gradient(bs, n):
    ref, t_ref = fit(64)
    acc, t = fit(bs, GradAccumCB(n))
    assert len(acc) == 1 and close(acc[0], ref[0])
    assert all(close(p, q) for p, q in zip(t.model.parameters(), t_ref.model.parameters()))

def test_grad_accum_steps_every_n_batches_across_epochs_and_drops_the_leftover():
    steps, t = fit(16, GradAccumCB(3), epochs=2)  # 4 batches per epoch: steps after batches 3 and 6 of 8; 2 left over
    assert len(steps) == 2
    assert all(p.grad is None or not p.grad.any() for p in t.model.parameters())
    assert close(steps[0], fit(48, n=48)[0][0])  # the first step: the first 48 rows

def test_grad_accum_keeps_the_reported_loss():
    losses = []
    class Loss(Callback):
        def after_batch(self, t): losses.append(t.loss.item())
    fit(16, GradAccumCB(4), Loss())
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))  # the weights do not move before the 4th batch
    assert losses == pytest.approx([nn.MSELoss()(model(X[i:i+16]), Y[i:i+16]).item() for i in range(0, 64, 16)], rel=1e-6)

@pytest.mark.parametrize('bs, n_micro, sizes', [(64, 4, [16] * 4), (10, 4, [3, 3, 2, 2]), (3, 5, [1, 1, 1])])
def test_micro_batches_give_the_whole_batch_gradient(bs, n_micro, sizes):
    seen = []
    class Sizes(Callback):
        def predict(self, t): seen.append(len(t.batch[0]))
    ref, t_ref = fit(bs, n=bs)
    mic, t = fit(bs, MicroBatchCB(n_micro), Sizes(), n=bs)
    assert seen == sizes and len(mic) == 1 and close(mic[0], ref[0])
    assert all(close(p, q) for p, q in zip(t.model.parameters(), t_ref.model.parameters()))

def test_micro_batches_leave_the_whole_batch_preds_and_mean_loss_for_metrics():
    rec = []
    class Rec(Callback):
        order = 1
        def after_batch(self, t): rec.append((len(t.batch[0]), t.preds.shape, t.loss.item()))
    _, t = fit(10, MicroBatchCB(3), Rec(), n=10, classify=True)
    n, shape, loss = rec[0]
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    assert (n, shape) == (10, (10, 3)) and loss == pytest.approx(nn.CrossEntropyLoss()(model(X[:10]), C[:10]).item(), rel=1e-6)

def test_micro_batches_in_validation_give_the_same_metrics():
    def metrics(*cbs):
        torch.manual_seed(1)
        t = Trainer(DataLoaders(TensorLoader(X, C, bs=16), TensorLoader(X, C, bs=20)), nn.CrossEntropyLoss(), torch.optim.SGD,
                    nn.Linear(5, 3), callbacks=[BasicTrainCB(), MetricsCB(Accuracy=MulticlassAccuracy()), *cbs])
        t.fit(1, lr=0.1)
        return t.MetricsCB.losses_epoch[-1], t.MetricsCB.metrics_epoch[-1]
    (l1, m1), (l2, m2) = metrics(), metrics(MicroBatchCB(3))
    assert l1['valid'] == pytest.approx(l2['valid'], rel=1e-5) and m1 == m2

def test_micro_batches_and_accumulation_compose():
    ref, _ = fit(64)
    both, _ = fit(32, MicroBatchCB(4), GradAccumCB(2))
    assert len(both) == 1 and close(both[0], ref[0])

def test_micro_batches_run_autocast_per_microbatch():
    on = []
    class Probe(Callback):
        def predict(self, t): on.append(torch.is_autocast_enabled('cpu'))
        def backward(self, t): on.append(torch.is_autocast_enabled('cpu'))
    fit(16, MicroBatchCB(2), MixedPrecisionCB(), Probe())
    assert on[:4] == [True, False, True, False] and not torch.is_autocast_enabled('cpu')

def test_clip_caps_the_total_norm_and_keeps_the_norm_before():
    ref, _ = fit(64)
    clipped, t = fit(64, GradClipCB(0.05))
    assert ref[0].norm() > 0.05
    assert clipped[0].norm().item() == pytest.approx(0.05, rel=1e-5)
    assert close(clipped[0], ref[0] * 0.05 / ref[0].norm(), 1e-5)
    assert t.GradClipCB.norm.item() == pytest.approx(ref[0].norm().item(), rel=1e-6)
    same, _ = fit(64, GradClipCB(100.))
    assert torch.equal(same[0], ref[0])

def test_clip_inf_norm():
    ref, _ = fit(64)
    clipped, _ = fit(64, GradClipCB(0.01, norm_type=float('inf')))
    assert clipped[0].abs().max().item() == pytest.approx(0.01, rel=1e-5)

def test_clip_after_accumulation_clips_the_accumulated_gradient_once():
    ref, _ = fit(64, GradClipCB(0.05))
    acc, _ = fit(16, GradAccumCB(4), GradClipCB(0.05))
    assert close(acc[0], ref[0])

def test_clip_sees_unscaled_float16_gradients():
    mp = MixedPrecisionCB(torch.float16)
    mp.load_state_dict({'scaler': {'scale': 1024., 'growth_factor': 2., 'backoff_factor': 0.5, 'growth_interval': 2000, '_growth_tracker': 0}})
    clipped, t = fit(64, mp, GradClipCB(0.05))
    assert mp.skipped == 0
    assert clipped[0].norm().item() == pytest.approx(0.05, rel=1e-3)
    ref, _ = fit(64)
    assert t.GradClipCB.norm.item() == pytest.approx(ref[0].norm().item(), rel=1e-2)  # float16 forward: close, not equal

@pytest.mark.parametrize('make, msg', [(lambda: GradAccumCB(0), 'n_batches must be a positive integer'),
                                       (lambda: GradAccumCB(2.0), 'n_batches must be a positive integer'),
                                       (lambda: GradAccumCB(True), 'n_batches must be a positive integer'),
                                       (lambda: MicroBatchCB(-1), 'n_micro must be a positive integer'),
                                       (lambda: GradClipCB(-1.0), 'max_norm must be a positive number'),
                                       (lambda: GradClipCB(0), 'max_norm must be a positive number'),
                                       (lambda: GradClipCB('1'), 'max_norm must be a positive number')])
def test_bad_arguments(make, msg):
    with pytest.raises(ValueError, match=msg): make()
