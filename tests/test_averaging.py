"Weight averaging (EMACB, SWACB): the average is the one computed by hand, moves only on applied steps, is validated on and swapped back, resumes exactly."
import copy
import pytest
import torch
from torch import nn
from aisaac.core.callback import Callback, CancelStepException
from aisaac.callbacks.averaging import EMACB, SWACB
from aisaac.callbacks.gradients import GradAccumCB
from aisaac.callbacks.savers import CheckpointCB, SaveBestModelCB, checkpoints
from aisaac.callbacks.metrics import MetricsCB
from tiny import make_trainer
import checkpoint_run

def weights(model): return {k: v.detach().clone() for k, v in model.state_dict().items()}

class Record(Callback):
    "The weights after each applied step, and those each validation batch sees"
    order = 50
    def before_fit(self, t): self.steps, self.valid = [], []
    def after_step(self, t): self.steps.append(weights(t.model))
    def after_predict(self, t):
        if not t.model.training: self.valid.append(weights(t.model))

class SkipEvery(Callback):
    "Skip the optimizer step of every `n`-th training batch, as a spike detector would"
    def __init__(self, n): self.n = n
    def before_step(self, t):
        if t.batch_num % self.n == self.n - 1: raise CancelStepException('skipped by the test')

def by_hand(steps, decay, first=0):
    "The exponential moving average of `steps` (dicts of weights) from the `first`-th on: the first copied, then lerp"
    avg = None
    for w in steps[first:]: avg = dict(w) if avg is None else {k: decay * avg[k] + (1 - decay) * w[k] for k in w}
    return avg

def test_ema_equals_the_average_computed_by_hand_over_the_applied_steps_only():
    rec, ema = Record(), EMACB(decay=0.8, start=2)
    t = make_trainer([ema, rec, SkipEvery(3)], n_train=(3,) * 6)
    t.fit(2, lr=0.1)
    assert len(rec.steps) == 8 and ema.n_averaged == 7  # 12 batches, 4 steps skipped; averaging from step 2
    avg = by_hand(rec.steps, 0.8, first=1)
    for k, v in ema.averaged_state().items(): assert torch.allclose(v, avg[k], atol=1e-7), k
    assert not torch.equal(t.model.weight, ema.averaged_state()['weight'])  # the model keeps its raw weights

def test_ema_half_life_and_every():
    assert EMACB(half_life=10).decay == pytest.approx(0.5 ** 0.1)
    assert EMACB(half_life='20 steps', every=2).decay == pytest.approx(0.5 ** 0.1)
    rec, ema = Record(), EMACB(decay=0.5, every=2)
    make_trainer([ema, rec], n_train=(3,) * 6).fit(1, lr=0.1, valid=False)
    avg = by_hand(rec.steps[1::2], 0.5)
    assert ema.n_averaged == 3 and torch.allclose(ema.averaged_state()['weight'], avg['weight'])

@pytest.mark.parametrize('make, msg', [(lambda: EMACB(), 'one of them'), (lambda: EMACB(decay=1.5), 'between 0 and 1'),
                                       (lambda: EMACB(half_life='2 epochs'), 'optimizer steps'), (lambda: EMACB(0.9, start=-1), '`start`'),
                                       (lambda: SWACB(every=0), '`every`')])
def test_bad_arguments(make, msg):
    with pytest.raises(ValueError, match=msg): make()

def test_validation_runs_on_the_average_and_the_raw_weights_come_back():
    rec, ema = Record(), EMACB(decay=0.5)
    t = make_trainer([ema, rec], n_train=(3,) * 4)
    t.fit(2, lr=0.1)
    avg = by_hand(rec.steps[:4], 0.5)  # the first epoch's validation sees the average of its 4 steps
    assert torch.equal(rec.valid[0]['weight'], avg['weight'])
    assert torch.equal(t.model.weight, rec.steps[-1]['weight'])  # after the fit: the raw weights

def test_never_swapped_before_the_first_update():
    "Lightning's issue 21724: a validation before averaging starts must see the trained weights, not a stale copy"
    rec, ema = Record(), EMACB(decay=0.5, start=100)
    t = make_trainer([ema, rec], n_train=(3,) * 4)
    t.fit(2, lr=0.1)
    assert ema.n_averaged == 0 and torch.equal(rec.valid[0]['weight'], rec.steps[3]['weight'])

class FailInValidation(Callback):
    def after_predict(self, t):
        if not t.model.training: raise ValueError('a metric failed')

def test_the_raw_weights_come_back_after_an_error_in_validation():
    rec, ema = Record(), EMACB(decay=0.5)
    t = make_trainer([ema, rec, FailInValidation()], n_train=(3,) * 4)
    with pytest.raises(ValueError, match='a metric failed'): t.fit(1, lr=0.1)
    assert not ema.swapped and torch.equal(t.model.weight, rec.steps[-1]['weight'])
    assert not torch.equal(t.model.weight, ema.averaged_state()['weight'])

def test_save_best_model_keeps_the_average_and_a_checkpoint_the_raw_weights(tmp_path):
    rec, ema = Record(), EMACB(decay=0.5)
    t = make_trainer([ema, rec, MetricsCB(), SaveBestModelCB(tmp_path/'best.pt'), CheckpointCB(tmp_path/'ckpt')], n_train=(3,) * 4)
    t.fit(1, lr=0.1)
    avg = by_hand(rec.steps, 0.5)
    assert torch.equal(torch.load(tmp_path/'best.pt', weights_only=True)['weight'], avg['weight'])
    state = torch.load(checkpoints(tmp_path/'ckpt')[-1], weights_only=True)
    assert torch.equal(state['model']['weight'], rec.steps[-1]['weight']) and torch.equal(state['callbacks']['EMACB']['averaged']['weight'], avg['weight'])
    assert torch.equal(t.model.weight, avg['weight'])  # SaveBestModelCB loaded the best (averaged) weights at the end, after EMACB put the raw ones back

@pytest.mark.parametrize('cls', ['ema', 'swa'])
def test_a_resumed_run_has_the_same_average(tmp_path, cls):
    "checkpoint_run's trainer (dropout, AdamW, one-cycle): a checkpoint in epoch 1 resumes to the same weights and the same average"
    make_cb = lambda: EMACB(half_life=5) if cls == 'ema' else SWACB(start=4, every=3)
    straight = checkpoint_run.make_trainer(callbacks=[cb := make_cb(), CheckpointCB(tmp_path/'a', every_n_batches=5, keep_last=None)])
    straight.fit(3)
    ckpt = tmp_path/'a'/'checkpoint_0001_000005.pt'
    resumed = checkpoint_run.make_trainer(callbacks=[cb2 := make_cb(), CheckpointCB(tmp_path/'b', every_n_batches=5)])
    resumed.fit(3, resume_from=ckpt)
    assert cb.n_averaged == cb2.n_averaged > 0
    a, b = cb.averaged_state(), cb2.averaged_state()
    for k in a: assert torch.equal(a[k], b[k]), k
    for k, v in straight.model.state_dict().items(): assert torch.equal(v, resumed.model.state_dict()[k]), k

def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))

def test_swa_is_the_mean_of_the_weights_with_batch_norm_statistics_recomputed():
    rec, swa = Record(), SWACB(start=2, every=2)
    t = make_trainer([swa, rec], model=bn_model(), n_train=(4,) * 8)
    t.fit(1, lr=0.1)
    assert swa.n_averaged == 4  # steps 2, 4, 6, 8
    avg = swa.averaged_state()
    for k in ('0.weight', '3.bias'): assert torch.allclose(avg[k], sum(rec.steps[i][k] for i in (1, 3, 5, 7)) / 4)
    # torch's recipe by hand: the mean weights in a copy, its batch-norm statistics recomputed over the training batches
    m = bn_model()
    m.load_state_dict({**weights(t.model), **{k: v for k, v in avg.items() if 'running' not in k and 'num_batches' not in k}})
    torch.optim.swa_utils.update_bn(t.dls.train, m)
    assert torch.allclose(avg['1.running_mean'], m[1].running_mean) and torch.allclose(avg['1.running_var'], m[1].running_var)
    assert not torch.allclose(avg['1.running_mean'], t.model[1].running_mean)  # not the raw model's running statistics
    swa.average_into(t.model)
    assert torch.equal(t.model[1].running_mean, avg['1.running_mean'])

def test_swa_by_pass_and_a_fraction_of_the_fit():
    rec, swa = Record(), SWACB(start=0.5)
    t = make_trainer([swa, rec], n_train=(3,) * 4)
    t.fit(4, lr=0.1, valid=False)  # 16 steps: averaging from step 8, at the end of passes 2, 3 and 4 (steps 8, 12, 16)
    assert swa.n_averaged == 3
    assert torch.allclose(swa.averaged_state()['weight'], sum(rec.steps[i]['weight'] for i in (7, 11, 15)) / 3)

def test_ema_moves_only_at_window_ends_under_accumulation():
    rec, ema = Record(), EMACB(decay=0.5)
    make_trainer([GradAccumCB(2), ema, rec], n_train=(3,) * 6).fit(1, lr=0.1, valid=False)
    assert ema.n_averaged == len(rec.steps) == 3

def test_averaging_a_sharded_model_is_refused():
    from aisaac.callbacks.sharding import FSDPCB
    fsdp = FSDPCB()
    fsdp.before_fit = lambda t: None  # (no process group here: only the refusal is tested)
    t = make_trainer([EMACB(0.9), fsdp])
    with pytest.raises(TypeError, match='FSDPCB shards them'): t.fit(1)

@pytest.mark.parametrize('cls', ['ema', 'swa'])
def test_a_fraction_of_a_second_fit_counts_from_where_that_fit_started_also_resumed(tmp_path, cls):
    "`start=0.75` in a second fit of a trainer (its clock at 12): averaging from step 12 + 9; resumed in a fresh trainer from a checkpoint of that fit (step 16), the same (before: from step 0 + 9 of the fresh trainer's clock, so 8 and 2 averages where the uninterrupted run had 4 and 1)"
    make_cb = lambda: EMACB(decay=0.9, start=0.75) if cls == 'ema' else SWACB(start=0.75)
    def second(t, d, **kw):
        t.fit(3, lr=0.1, valid=False, callbacks=[cb := make_cb(), CheckpointCB(d, keep_last=None)], **kw)
        return cb
    first = lambda: (t := make_trainer(n_train=(3,) * 4), t.fit(3, lr=0.1, valid=False))[0]  # 12 steps
    cb = second(first(), tmp_path/'a')
    assert cb.n_averaged == (4 if cls == 'ema' else 1)  # steps 21 to 24 / the end of the pass at step 24
    again = make_trainer(n_train=(3,) * 4)
    cb2 = second(again, tmp_path/'b', resume_from=tmp_path/'a'/'checkpoint_0004_000000.pt')  # (the second fit's first epoch: numbered after the first fit's 3)
    assert cb2.n_averaged == cb.n_averaged
    a, b = cb.averaged_state(), cb2.averaged_state()
    for k in a: assert torch.equal(a[k], b[k]), k

def test_swas_averaged_copy_has_none_of_the_models_hooks():
    """The average is made without the forward hooks and pre-hooks on the model (an activation recorder's): they are not copied into
    it, nor called by its batch-norm recomputation. Before: `AveragedModel` deep-copied them; a counting hook was called 16 times for
    8 training batches (8 more in `update_bn` on the copy), and the copy held both hooks"""
    calls, pre = [], []
    model = bn_model()
    model[0].register_forward_hook(lambda m, i, o: calls.append(len(i[0])))
    model.register_forward_pre_hook(lambda m, i: pre.append(1))
    swa = SWACB(start=2, every=2)
    t = make_trainer([swa], model=model, n_train=(4,) * 8)
    t.fit(1, lr=0.1, valid=False)
    assert len(calls) == len(pre) == 8  # the training batches only
    copy_ = swa.swa.module
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in copy_.modules())
    assert model[0]._forward_hooks and model._forward_pre_hooks  # the model's own are kept

def test_swa_after_a_transaction_averages_into_its_own_model():
    """Found by the invariance harness (issue 51): a transaction (lr_find, capture_preds, summarize_model...) copied `avg` apart from the
    averaged model it was the tensors of, so the next fit averaged into a loose copy and validated on a stale one (valid loss 1.0094
    against the straight run's 1.0400); now `avg` is read from the averaged model"""
    from aisaac.coverage import check
    assert check(['SWACB'], 'transactions') == []
    t = make_trainer([swa := SWACB(start=0)])
    t.fit(1)
    with t.transaction(): pass
    assert all(a.data_ptr() == p.data_ptr() for a, p in zip(swa.avg, swa.swa.module.parameters()))

@pytest.mark.parametrize('name', ['SWACB', 'EMACB'])
def test_a_fit_resumed_at_its_saved_stop_has_the_average_the_straight_fit_made(name):
    """Found by the invariance harness (issue 51: ThresholdStopperCB + SWACB + BatchTransformCB under `resume`, stopped at the end of epoch
    0): the stopper reached its threshold at epoch 0, so the checkpoint held its stop and the resumed fit ended before its first pass.
    The average it loaded was made only at its first use, which never came: after the fit `SWACB.swa` was `None` where the straight
    fit's held the averaged model (`average_into` worked, `swa.module` raised). Now the fit's end makes it"""
    from aisaac.coverage import check
    assert check(['ThresholdStopperCB', name, 'BatchTransformCB'], 'resume') == []
