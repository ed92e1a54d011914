"Schedulers: the LR and momentum the optimizer uses at each step equal PyTorch's schedulers run by hand; steps only in training; state for checkpoints; errors."
import io
from functools import partial
import pytest
import torch
from torch import nn

from aisaac.core.callback import Callback
from aisaac.callbacks.schedule import (BaseSchedulerCB, BatchSchedulerCB, EpochSchedulerCB, OneCycleSchedulerCB,
                                       BaseSchedCB, BatchSchedCB, EpochSchedCB, WarmupCosineSchedulerCB, PlateauSchedulerCB)
from tiny import make_trainer
import tiny
from aisaac.trainer import Trainer

N_TRAIN = 5  # batches per epoch of the loaders below

class StepRecorder(Callback):
    "The LR and momentum (or beta1) of each parameter group at each optimizer step"
    def before_fit(self, t): self.lrs, self.moms = [], []
    def before_step(self, t):
        self.lrs.append([g['lr'] for g in t.opt.param_groups])
        self.moms.append([g['betas'][0] if 'betas' in g else g['momentum'] for g in t.opt.param_groups])

class CountEvents(Callback):
    def before_fit(self, t): self.sched_steps, self.valid_batches = 0, 0
    def after_scheduler_step(self, t): self.sched_steps += 1
    def after_batch(self, t): self.valid_batches += not t.model.training

def trainer(*cbs, opt_func=partial(torch.optim.SGD, momentum=0.9)):
    return make_trainer(list(cbs), opt_func=opt_func, n_train=(4,) * N_TRAIN, n_valid=(4, 4))

def by_hand(sched_func, opt_func, lr, n_steps):
    opt = opt_func(nn.Linear(2, 1).parameters(), lr=lr)
    sched = sched_func(opt)
    lrs, moms = [], []
    for _ in range(n_steps):
        g = opt.param_groups[0]
        lrs.append([g['lr']]); moms.append([g['betas'][0] if 'betas' in g else g['momentum']])
        opt.step(); sched.step()
    return lrs, moms

def test_one_cycle_sgd_momentum_and_kwargs_match_torch():
    rec = StepRecorder()
    trainer(OneCycleSchedulerCB(pct_start=0.25, div_factor=10., final_div_factor=100.), rec).fit(3, lr=0.2)
    lrs, moms = by_hand(partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.2, total_steps=3 * N_TRAIN, pct_start=0.25,
                                div_factor=10., final_div_factor=100.), partial(torch.optim.SGD, momentum=0.9), 0.2, 3 * N_TRAIN)
    assert rec.lrs == lrs and rec.moms == moms
    assert rec.lrs[0] == [pytest.approx(0.02)] and max(l[0] for l in rec.lrs) == pytest.approx(0.2, rel=1e-2)
    assert rec.moms[0] == [pytest.approx(0.95)] and min(m[0] for m in rec.moms) == pytest.approx(0.85, rel=1e-2)

def test_max_lr_and_total_steps_given_win_over_the_fit():
    rec = StepRecorder()
    trainer(OneCycleSchedulerCB(max_lr=0.05, total_steps=20), rec).fit(2, lr=1.0)
    lrs, _ = by_hand(partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.05, total_steps=20),
                     partial(torch.optim.SGD, momentum=0.9), 1.0, 2 * N_TRAIN)
    assert rec.lrs == lrs

def test_batch_scheduler_steps_per_training_batch_only_through_the_trainer():
    count, rec = CountEvents(), StepRecorder()
    t = trainer(BatchSchedulerCB(partial(torch.optim.lr_scheduler.ExponentialLR, gamma=0.5)), count, rec)
    t.fit(2, lr=1.0)
    assert count.valid_batches == 4 and count.sched_steps == 2 * N_TRAIN
    assert t.BatchSchedulerCB.scheduler.last_epoch == 2 * N_TRAIN
    assert [l[0] for l in rec.lrs] == [0.5 ** i for i in range(2 * N_TRAIN)]

def test_epoch_scheduler_steps_after_each_training_pass():
    count, rec = CountEvents(), StepRecorder()
    t = trainer(EpochSchedulerCB(partial(torch.optim.lr_scheduler.MultiStepLR, milestones=[1, 2], gamma=0.1)), count, rec)
    t.fit(3, lr=1.0)
    assert count.sched_steps == 3
    assert [l[0] for l in rec.lrs] == pytest.approx([1.0] * N_TRAIN + [0.1] * N_TRAIN + [0.01] * N_TRAIN)

def test_a_new_scheduler_each_fit_from_the_new_optimizer():
    cb = BatchSchedulerCB(partial(torch.optim.lr_scheduler.StepLR, step_size=1))
    t = trainer(cb)
    t.fit(1)
    first = cb.scheduler
    t.fit(1)
    assert cb.scheduler is not first and cb.scheduler.optimizer is t.opt and cb.scheduler.last_epoch == N_TRAIN

def test_no_training_no_step():
    count = CountEvents()
    trainer(OneCycleSchedulerCB(), count).fit(1, train=False)
    assert count.sched_steps == 0

def test_miniai_names_are_the_same_callbacks():
    assert issubclass(BaseSchedCB, BaseSchedulerCB) and issubclass(BatchSchedCB, BatchSchedulerCB) and issubclass(EpochSchedCB, EpochSchedulerCB)
    a, b = StepRecorder(), StepRecorder()
    sched = partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=2 * N_TRAIN)
    trainer(BatchSchedCB(sched), a).fit(2, lr=0.1)
    trainer(BatchSchedulerCB(sched), b).fit(2, lr=0.1)
    assert a.lrs == b.lrs and a.lrs[-1][0] < 0.01

def test_state_survives_torch_save_with_weights_only_and_resumes_the_schedule():
    class Cut(Callback):
        def checkpoint(self, t, at):
            if at == 'epoch' and t.epoch == 1:
                buf = io.BytesIO(); torch.save(t.callbacks_state_dict(), buf); self.saved = buf.getvalue()
    cut, full = Cut(), StepRecorder()
    trainer(OneCycleSchedulerCB(), cut, full).fit(4, lr=0.1)
    state = torch.load(io.BytesIO(cut.saved), weights_only=True)
    assert state['OneCycleSchedulerCB']['scheduler']['last_epoch'] == 2 * N_TRAIN
    rec = StepRecorder()
    t = trainer(OneCycleSchedulerCB(), rec)
    t.load_callbacks_state_dict(state)
    assert t.OneCycleSchedulerCB.state_dict() == state['OneCycleSchedulerCB']  # kept until the fit makes the scheduler
    t.fit(2, lr=0.1)
    assert rec.lrs == full.lrs[2 * N_TRAIN:]

def test_state_loaded_during_a_fit_goes_to_the_running_scheduler():
    class LoadAtStart(Callback):
        order = 1  # after the scheduler callback made its scheduler
        def __init__(self, state): self.state = state
        def before_fit(self, t): t.load_callbacks_state_dict(self.state)
    src = trainer(BatchSchedulerCB(partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)))
    src.fit(1, lr=1.0)
    rec = StepRecorder()
    t = trainer(BatchSchedulerCB(partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)), rec)
    t.fit(1, lr=1.0, callbacks=[LoadAtStart(src.callbacks_state_dict())])
    assert [l[0] for l in rec.lrs] == [0.5 ** i for i in range(N_TRAIN, 2 * N_TRAIN)]

def test_state_dict_is_empty_before_the_first_fit():
    assert OneCycleSchedulerCB().state_dict() == {}
    cb = OneCycleSchedulerCB(); cb.load_state_dict({})
    assert cb.state_dict() == {}

class NoLen:
    def __init__(self, batches): self.batches = batches
    def __iter__(self): return iter(self.batches)

def test_errors_name_the_fix():
    t = trainer()
    t.dls.train = NoLen(t.dls.train)
    with pytest.raises(TypeError, match=r"has no len\(\).*OneCycleSchedulerCB\(total_steps="): t.fit(1, callbacks=[OneCycleSchedulerCB()])
    with pytest.raises(TypeError, match="max_lrr"): OneCycleSchedulerCB(max_lrr=1)
    with pytest.raises(TypeError, match="scheduler_func"): BatchSchedulerCB(None)
    with pytest.raises(ValueError, match=r"cycle_momentum=False"): trainer(OneCycleSchedulerCB(), opt_func=torch.optim.Adagrad).fit(1)
    trainer(OneCycleSchedulerCB(cycle_momentum=False), opt_func=torch.optim.Adagrad).fit(1)

# ---------------------------------------------------------------- warm-up then cosine; plateaus
def test_warmup_cosine_follows_its_formula_over_the_fits_applied_steps():
    "A run of 40 steps, 4 batches per step: the LR of step i is lr * warmup_cosine(i, 40, 4, 0.1), rising then falling to 0.1 lr"
    from aisaac.callbacks.schedule import WarmupCosineSchedulerCB, warmup_cosine
    from aisaac.callbacks.gradients import GradAccumCB
    from aisaac.callbacks.monitors import LRMonitorCB
    from checkpoint_run import make_dls
    from aisaac.callbacks.train import BasicTrainCB
    torch.manual_seed(0)
    t = Trainer(make_dls('seeded'), nn.CrossEntropyLoss(), torch.optim.AdamW, nn.Linear(4, 3),
                callbacks=[BasicTrainCB(), GradAccumCB(4), sched := WarmupCosineSchedulerCB(warmup=0.1), lr := LRMonitorCB()])
    t.fit(steps=40, lr=0.02)
    assert (sched.total, sched.warmup_steps) == (40, 4)
    assert lr.recs['lr'] == pytest.approx([0.02 * warmup_cosine(i, 40, 4, 0.1) for i in range(40)])
    assert max(lr.recs['lr']) == pytest.approx(0.02) and lr.recs['lr'][-1] == pytest.approx(0.02 * 0.1, rel=0.02)

def test_a_plateau_lowers_the_lr_and_a_missing_metric_is_an_error():
    from aisaac.callbacks.schedule import PlateauSchedulerCB, EpochSchedulerCB
    from aisaac.callbacks.metrics import MetricsCB
    class Script(Callback):
        def __init__(self, values): self.values = values
        def checkpoint(self, t, at):
            if at == 'epoch': t.history.update_metric('score', self.values[t.epoch], step=t.epoch)
    t = tiny.make_trainer([Script([1.0, 0.5, 0.6, 0.7, 0.8]), p := PlateauSchedulerCB('score', patience=1, factor=0.5)])
    t.fit(5, lr=0.1)
    assert t.opt.param_groups[0]['lr'] == pytest.approx(0.05)  # 0.6 and 0.7 did not improve on 0.5: more than patience=1 epochs, halved after epoch 3
    with pytest.raises(ValueError, match="PlateauSchedulerCB needs 'valid_acc', which none of the callbacks"): tiny.make_trainer([MetricsCB(), PlateauSchedulerCB('valid_acc')]).fit(1)
    with pytest.raises(TypeError, match='use `PlateauSchedulerCB'):
        tiny.make_trainer([EpochSchedulerCB(torch.optim.lr_scheduler.ReduceLROnPlateau)]).fit(1)

# ---------------------------------------------------------------- under gradient accumulation the schedules end where they say
def _accumulating(sched, **fit):
    "2 epochs of 10 batches (or a run of steps) at 4 batches a step: windows cross the epochs, 20 batches make 5 steps"
    from aisaac.callbacks.gradients import GradAccumCB
    from aisaac.callbacks.monitors import LRMonitorCB
    t = make_trainer([GradAccumCB(4), sched, rec := LRMonitorCB()], opt_func=partial(torch.optim.SGD, momentum=0.9), n_train=(4,) * 10)
    t.fit(**fit, lr=0.1, valid=False)
    return t, rec.recs['lr']

@pytest.mark.parametrize('fit', [{'n_epochs': 2}, {'steps': 5}])
def test_warmup_cosine_ends_exactly_at_its_final_lr_under_accumulation(fit):
    from aisaac.callbacks.schedule import WarmupCosineSchedulerCB, warmup_cosine
    t, lrs = _accumulating(sched := WarmupCosineSchedulerCB(warmup=1, final=0.1), **fit)
    assert t.planned_steps() == sched.total == t.clock.step == len(lrs) == 5 and t.clock.micro_step == 20
    assert t.opt.param_groups[0]['lr'] == pytest.approx(0.01, rel=1e-9)  # after the last step: lr * final (0.0186 when 6 were planned)
    assert lrs == pytest.approx([0.1 * warmup_cosine(i, 5, 1, 0.1) for i in range(5)])

@pytest.mark.parametrize('fit', [{'n_epochs': 2}, {'steps': 5}])
def test_one_cycle_is_sized_by_the_applied_steps_under_accumulation(fit):
    "Its last applied step is the cycle's last: the LR at its lowest, max_lr / div_factor / final_div_factor"
    t, lrs = _accumulating(sched := OneCycleSchedulerCB(), **fit)
    assert sched.scheduler.total_steps == t.clock.step == len(lrs) == 5
    assert lrs[-1] == pytest.approx(0.1 / 25 / 1e4)

def test_a_fit_after_one_that_accumulated_plans_its_own_steps():
    "GradAccumCB for one fit only: the next fit, without it, plans a step per batch (batches_per_step went back to 1)"
    from aisaac.callbacks.gradients import GradAccumCB
    t = trainer()
    t.fit(2, callbacks=[GradAccumCB(4)], valid=False)
    t.fit(2, callbacks=[sched := OneCycleSchedulerCB()], valid=False)
    assert t.planned_steps() == sched.scheduler.total_steps == 2 * N_TRAIN and t.clock.step == 2 + 2 * N_TRAIN

@pytest.mark.parametrize('make', [lambda: OneCycleSchedulerCB(), lambda: WarmupCosineSchedulerCB(warmup=2),
                                  lambda: BatchSchedCB(partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=10)),
                                  lambda: EpochSchedulerCB(partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)),
                                  lambda: PlateauSchedulerCB(patience=0, factor=0.5)],
                         ids=['one-cycle', 'warm-up and cosine', 'torch scheduler per batch', 'torch scheduler per epoch', 'plateau'])
def test_every_schedule_keeps_the_ratio_of_the_layer_groups_rates(make):
    "`fit(lr=slice(1e-3, 1e-2))` on a body and a head: at every step of every schedule the body's rate is a tenth of the head's, and the schedule moved"
    rec, worse = StepRecorder(), tiny.Script(valid_loss=[1., 2., 3.])  # (a valid loss that only grows: the plateau scheduler lowers the rates)
    model = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
    t = make_trainer([worse, make(), rec], opt_func=partial(torch.optim.SGD, momentum=0.9), model=model, n_train=(4,) * N_TRAIN, n_valid=(4,))
    t.fit(3, lr=slice(1e-3, 1e-2))
    assert [g['name'] for g in t.opt.param_groups] == ['body', 'head']
    assert all(body == pytest.approx(head / 10) for body, head in rec.lrs), rec.lrs
    assert len({round(head, 12) for _, head in rec.lrs}) > 1

def test_one_cycle_at_fastais_positions_is_fastais_formula():
    "`positions='fastai'`: the rate and momentum of step i are the one-cycle's at i / steps (fastai's `fit_one_cycle`), which torch's `OneCycleLR` puts one step later (its peak at step pct_start * steps - 1, its last step at the end rate)"
    rec = StepRecorder()
    trainer(OneCycleSchedulerCB(pct_start=0.25, final_div_factor=1e5 / 25, positions='fastai'), rec).fit(3, lr=0.2)
    lrs, moms = tiny.fastai_one_cycle(3 * N_TRAIN, 0.2, 0.25)
    assert [l[0] for l in rec.lrs] == pytest.approx(lrs, rel=1e-9) and [m[0] for m in rec.moms] == pytest.approx(moms, rel=1e-9)
    with pytest.raises(ValueError, match="'torch' or 'fastai'"): OneCycleSchedulerCB(positions='keras')
    with pytest.raises(ValueError, match='three_phase'): OneCycleSchedulerCB(positions='fastai', three_phase=True)

# ---------------------------------------------------------------- nanoGPT's schedule: warm-up to w+1, a decay shorter than the fit, a floor
def nanogpt_get_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    "nanoGPT's `get_lr` (train.py), written out: the rate of iteration `it`, set before its step"
    import math
    if it < warmup_iters: return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters: return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)

def _rates(sched, steps, lr, opt_func=torch.optim.AdamW, **kw):
    "The rate each optimizer step of a run of `steps` used, per parameter group"
    from aisaac.callbacks.monitors import LRMonitorCB
    rec = StepRecorder()
    t = make_trainer([sched, rec], opt_func=opt_func, n_train=(4,) * 7, **kw)
    t.fit(steps=steps, lr=lr, valid=False)
    return t, rec.lrs

@pytest.mark.parametrize('warmup,decay', [(10, 40), (3, 60), (0, 25), (5, 6)])
def test_warmup_cosine_in_nanogpts_form_is_its_get_lr_bit_for_bit(warmup, decay):
    "nanoGPT's recipe (warm-up (it+1)/(w+1), cosine over lr_decay_iters, min_lr after): every step's rate equals `get_lr(it)` exactly"
    t, lrs = _rates(WarmupCosineSchedulerCB(warmup=warmup, decay=decay, min_lr=6e-5, warmup_form='nanogpt'), 50, 6e-4)
    assert [l[0] for l in lrs] == [nanogpt_get_lr(i, 6e-4, warmup, decay, 6e-5) for i in range(50)]

def test_warmup_cosine_decay_shorter_than_the_fit_holds_its_floor():
    "`decay=20` in a fit of 30 steps: the cosine reaches `final` times the rate at step 20 and stays there; a fraction of the fit works too"
    from aisaac.callbacks.schedule import warmup_cosine
    _, lrs = _rates(WarmupCosineSchedulerCB(warmup=4, decay=20, final=0.1), 30, 0.1, opt_func=partial(torch.optim.SGD, momentum=0.9))
    lrs = [l[0] for l in lrs]
    assert lrs[:21] == pytest.approx([0.1 * warmup_cosine(i, 20, 4, 0.1) for i in range(21)])
    assert lrs[20:] == [pytest.approx(0.01)] * 10
    _, half = _rates(sched := WarmupCosineSchedulerCB(warmup=4, decay=0.5, final=0.1), 30, 0.1, opt_func=partial(torch.optim.SGD, momentum=0.9))
    assert sched.decay_steps == 15 and [l[0] for l in half][15:] == [pytest.approx(0.01)] * 15

def test_warmup_cosine_default_is_unchanged():
    "Without the new options the schedule is the one it always was: (s+1)/w, then the cosine to `final` over the fit, the same floats"
    from aisaac.callbacks.schedule import warmup_cosine
    _, lrs = _rates(WarmupCosineSchedulerCB(warmup=4), 30, 0.1, opt_func=partial(torch.optim.SGD, momentum=0.9))
    assert [l[0] for l in lrs] == [0.1 * warmup_cosine(i, 30, 4, 0.1) for i in range(30)]

def test_warmup_cosine_min_lr_floors_every_group_and_refuses_one_below_it():
    "min_lr is a rate: each group decays to it (the groups of `lr=slice`); a group whose peak is below it is an error that says so"
    from aisaac.params import ParamGroups
    t, lrs = _rates(WarmupCosineSchedulerCB(warmup=2, decay=10, min_lr=1e-3, warmup_form='nanogpt'), 12, 0.1,
                    opt_func=partial(torch.optim.AdamW, weight_decay=0.1))
    assert len(lrs[0]) == 2 and lrs[-1] == [1e-3, 1e-3]  # the decayed and the no-decay halves
    with pytest.raises(ValueError, match=r"min_lr=0.5 is above the peak rate 0.1 of parameter group 0"):
        _rates(WarmupCosineSchedulerCB(min_lr=0.5), 12, 0.1)

def test_warmup_cosine_options_are_checked():
    with pytest.raises(ValueError, match="warmup_form"): WarmupCosineSchedulerCB(warmup_form='karpathy')
    with pytest.raises(ValueError, match="either `final`.*or `min_lr`"): WarmupCosineSchedulerCB(final=0.1, min_lr=1e-4)
    with pytest.raises(ValueError, match="`decay` is"): WarmupCosineSchedulerCB(decay=-3)
    with pytest.raises(ValueError, match=r"decays over 5 steps.*warm-up of 10"): _rates(WarmupCosineSchedulerCB(warmup=10, decay=5), 20, 0.1)
