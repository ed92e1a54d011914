"LossSpikeCB: a spike is skipped (no step, no scheduler or average moving), a rollback restores the state before it with lower rates, a stop ends the fit; its record resumes; 2 processes agree."
import functools, math, types
from pathlib import Path
import pytest
import torch
from torch import nn
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.schedule import BatchSchedulerCB
from aisaac.callbacks.averaging import EMACB
from aisaac.callbacks.gradients import GradAccumCB, GradClipCB
from aisaac.callbacks.savers import CheckpointCB
from aisaac.callbacks.spikes import LossSpikeCB
import torchrun_cases

HERE = Path(__file__).parent

def line_dls(n_batches=24, bs=8, seed=0):
    "A learnable line, y = x @ w + a little noise: the loss goes down smoothly, so only an injected spike is one"
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 1, generator=g)
    def batch():
        x = torch.randn(bs, 4, generator=g)
        return x, x @ w + 0.01 * torch.randn(bs, 1, generator=g)
    return types.SimpleNamespace(train=[batch() for _ in range(n_batches)], valid=[batch() for _ in range(2)])

def make(*cbs, n_batches=24, opt=torch.optim.SGD):
    torch.manual_seed(0)
    return Trainer(line_dls(n_batches), nn.MSELoss(), opt, nn.Linear(4, 1), callbacks=[BasicTrainCB(), *cbs])

class Spike(Callback):
    "Multiply the loss of training batch `batch` (of pass `epoch`) by `times` before backward: a spike in the loss and the gradients"
    order = -1
    def __init__(self, batch, times=1e4, epoch=0): self.batch, self.times, self.epoch = batch, times, epoch
    def after_loss(self, t):
        if t.model.training and (t.epoch, t.batch_num) == (self.epoch, self.batch): t.loss = t.loss * self.times

class Watch(Callback):
    "The weights at the end of each training batch, the skips' reasons, the learning rate at each step"
    order = 60
    def before_fit(self, t): self.at, self.skips, self.lrs = {}, [], []
    def step_skipped(self, t, reason): self.skips.append(reason)
    def after_step(self, t): self.lrs.append(t.opt.param_groups[0]['lr'])
    def checkpoint(self, t, at):
        if at == 'batch': self.at[(t.epoch, t.batch_num)] = {k: v.clone() for k, v in t.model.state_dict().items()}

def test_a_spike_is_skipped_and_nothing_moves():
    "The spike's step is not taken: its gradients are dropped, the scheduler and the average stay, `step_skipped` says why"
    w, ema = Watch(), EMACB(decay=0.9)
    spikes = LossSpikeCB('skip', warmup=3)
    sched = BatchSchedulerCB(functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.99))
    t = make(spikes, Spike(10), w, ema, sched)
    t.fit(1, lr=0.05, valid=False)
    assert t.clock.step == 23 and ema.n_averaged == 23 and sched.scheduler.last_epoch == 23
    assert len(w.skips) == 1 and 'the loss is' in w.skips[0] and 'above 3.0 times its running median' in w.skips[0] and 'step 11' in w.skips[0]
    assert torch.equal(w.at[(0, 10)]['weight'], w.at[(0, 9)]['weight'])  # batch 10 changed nothing
    assert spikes.skipped == [[0, 10, 0, 10]] and [e['action'] for e in spikes.events] == ['skip']
    assert all(p.grad is None or not p.grad.any() for p in t.model.parameters())

def test_without_the_callback_the_spike_goes_through():
    w = Watch()
    make(Spike(10), w).fit(1, lr=0.05, valid=False)
    assert not torch.equal(w.at[(0, 10)]['weight'], w.at[(0, 9)]['weight']) and not w.skips

def test_a_non_finite_or_huge_gradient_norm_is_a_spike():
    class NaN(Callback):
        def after_loss(self, t):
            if t.model.training and t.batch_num == 5: t.loss = t.loss * float('nan')
    w = Watch()
    make(LossSpikeCB('skip'), NaN(), w, GradClipCB(1.)).fit(1, lr=0.05, valid=False)
    assert len(w.skips) == 1 and 'not finite' in w.skips[0]
    w = Watch()
    make(LossSpikeCB('skip', factor=1e9, max_grad_norm=50.), Spike(12, times=100.), w).fit(1, lr=0.05, valid=False)
    assert len(w.skips) == 1 and 'the gradient norm is' in w.skips[0] and 'above its limit 50' in w.skips[0]

def test_a_rollback_restores_the_state_before_the_spike_with_lower_rates():
    "Checks every 4 steps, snapshots every 8: the spike at batch 13 is seen at step 16, and the state after batch 7 (step 8's clean check) comes back"
    w = Watch()
    spikes = LossSpikeCB('rollback', warmup=3, check_every=4, snapshot_every=8, lr_factor=0.5)
    t = make(spikes, Spike(13), w)
    t.opt_func = lambda params, lr: torch.optim.SGD([{'params': [p]} for p in params], lr=lr)  # two groups
    t.fit(1, lr=0.1, valid=False)
    assert [e['action'] for e in spikes.events] == ['rollback'] and 'step 14' in spikes.events[0]['reason']
    assert spikes.skipped == [[0, 8, 0, 15]]  # batches 8 to 15 trained on, then undone
    assert torch.equal(w.at[(0, 15)]['weight'], w.at[(0, 7)]['weight']) and torch.equal(w.at[(0, 15)]['bias'], w.at[(0, 7)]['bias'])
    assert w.lrs[:8] == [0.1] * 8 and w.lrs[15:] == [0.05] * (len(w.lrs) - 15)  # steps after the rollback: each group halved
    assert [g['lr'] for g in t.opt.param_groups] == [0.05, 0.05] and t.clock.step == 8 + 8

class Rates(Callback):
    "Each group's learning rate at each applied step, by the clock's step"
    order = 60
    def before_fit(self, t): self.at = {}
    def after_step(self, t): self.at[t.clock.step] = [g['lr'] for g in t.opt.param_groups]

def test_a_rollback_scales_each_groups_rate_and_the_schedule_goes_on_lowered():
    "Two groups (0.1 and 0.01) on a schedule: after the rollback, each group's rate is half the one its schedule gives it"
    def run(*cbs):
        rates = Rates()
        sched = BatchSchedulerCB(functools.partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=lambda s: 1 / (1 + 0.1 * s)))
        t = make(sched, rates, *cbs)
        t.opt_func = lambda params, lr: torch.optim.SGD([{'params': [t.model.weight]}, {'params': [t.model.bias], 'lr': lr / 10}], lr=lr)
        t.fit(1, lr=0.1, valid=False)
        return rates.at
    plain, rolled = run(), run(LossSpikeCB('rollback', warmup=3, check_every=4, snapshot_every=8), Spike(13))
    assert rolled[8] == plain[8] and plain[8][0] == pytest.approx(10 * plain[8][1])
    for s in range(9, 17): assert rolled[s] == pytest.approx([r / 2 for r in plain[s]]), s

def test_rollbacks_lower_the_rate_again_and_then_stop():
    spikes = LossSpikeCB('rollback', warmup=3, check_every=2, snapshot_every=4, max_rollbacks=1)
    t = make(spikes, Spike(9), Spike(15, epoch=0))
    t.fit(1, lr=0.1, valid=False)
    assert [e['action'] for e in spikes.events] == ['rollback', 'stop'] and 'after 1 rollbacks' in spikes.reason
    assert t.outcome == 'cancelled' and t.opt.param_groups[0]['lr'] == 0.05

def test_stop():
    spikes = LossSpikeCB('stop', warmup=3, check_every=1)
    t = make(spikes, Spike(6))
    t.fit(2, lr=0.05)
    assert t.outcome == 'cancelled' and t.clock.step == 6 and 'the fit stops' in spikes.reason

def test_skip_needs_a_decision_every_step_and_other_bad_arguments():
    with pytest.raises(ValueError, match="leave `check_every` at 1"): LossSpikeCB('skip', check_every=10)
    with pytest.raises(ValueError, match='multiple of `check_every`'): LossSpikeCB(check_every=10, snapshot_every=15)
    with pytest.raises(ValueError, match="'skip', 'rollback' or 'stop'"): LossSpikeCB('ignore')

def test_a_spike_inside_an_accumulation_window_skips_the_whole_window():
    w = Watch()
    spikes = LossSpikeCB('skip', warmup=2)
    t = make(GradAccumCB(3), spikes, Spike(10), w)
    t.fit(1, lr=0.05, valid=False)
    assert spikes.skipped == [[0, 9, 0, 11]] and t.clock.step == 7 and len(w.skips) == 16 + 1  # 16 accumulation skips, 1 spike
    assert torch.equal(w.at[(0, 11)]['weight'], w.at[(0, 8)]['weight'])

def test_a_resume_from_a_checkpoint_after_the_spike_is_exact(tmp_path):
    "The running losses and the record are in the checkpoint: resuming after batch 16 gives the uninterrupted run's weights"
    mk = lambda d: make(LossSpikeCB('skip', warmup=3), Spike(10), Spike(20), CheckpointCB(d, every_n_batches=8, keep_last=None), n_batches=24)
    straight = mk(tmp_path/'a')
    straight.fit(2, lr=0.05)
    resumed = mk(tmp_path/'b')
    resumed.fit(2, lr=0.05, resume_from=tmp_path/'a'/'checkpoint_0000_000016.pt')
    for k, v in straight.model.state_dict().items(): assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert resumed.LossSpikeCB.skipped == straight.LossSpikeCB.skipped == [[0, 10, 0, 10], [0, 20, 0, 20]]

def test_a_resume_from_before_the_spike_skips_the_recorded_batches(tmp_path):
    "PaLM's recipe: stop at the spike, go back to an earlier checkpoint and skip the batches around it; the record does it"
    first = LossSpikeCB('skip', warmup=3)
    straight = make(first, Spike(10), CheckpointCB(tmp_path, every_n_batches=4, keep_last=None))
    straight.fit(1, lr=0.05)
    again = make(LossSpikeCB('skip', factor=1e9, skip=first.skipped), Spike(10))  # a detector that would not see it
    again.fit(1, lr=0.05, resume_from=tmp_path/'checkpoint_0000_000008.pt')
    for k, v in straight.model.state_dict().items(): assert torch.equal(v, again.model.state_dict()[k]), k

TORCHRUN_CASES = HERE/'spikes_run.py', {c: [c] for c in ('skip', 'rollback', 'resume')}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/spikes_run.py: those the selected tests use run in one torchrun launch (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

@torchrun_cases.uses('skip')
def test_two_processes_skip_the_same_step_when_one_sees_a_spike(cases):
    r0, r1 = cases('skip')
    assert r0['steps'] == r1['steps'] == 15 and r0['weights'] == r1['weights']
    assert 'a spike on another process' in r0['skips'][0] and 'the loss is' in r1['skips'][0]

@torchrun_cases.uses('rollback')
def test_two_processes_roll_back_together_to_the_state_before_the_spike(cases):
    r0, r1 = cases('rollback')
    for r in (r0, r1):
        assert r['events'] == ['rollback'] and r['lr'] == 0.05 and r['back_to_snapshot']
    assert r0['weights'] == r1['weights'] and r0['steps'] == r1['steps']

@torchrun_cases.uses('resume')
def test_two_processes_resume_between_the_spike_and_its_check_and_roll_back_as_the_uninterrupted_run(cases):
    "The checkpoint (rank 0's) holds the snapshot and the decisions not read yet: both processes resumed roll back to it and end as the uninterrupted run"
    r0, r1 = cases('resume')
    for r in (r0, r1):
        assert r['events'] == ['rollback'] and r['back_to_snapshot']
        assert r['resumed']['weights'] == r['weights'] and r['resumed']['skipped'] == [[0, 8, 0, 11]]
    assert r0['weights'] == r1['weights']

def test_a_rollback_in_a_run_of_steps_under_accumulation_then_an_exact_resume(tmp_path):
    "fit(steps=14) at 2 batches a step, with EMACB: the rollback keeps the run's step count, and a checkpoint written after it resumes exactly"
    def mk(d):
        return make(GradAccumCB(2), LossSpikeCB('rollback', warmup=2, check_every=2, snapshot_every=4), Spike(13), EMACB(0.9),
                    CheckpointCB(d, every='3 steps', keep_last=None))
    straight = mk(tmp_path/'a')
    straight.fit(steps=14, valid_every=7, lr=0.05)
    spikes = straight.LossSpikeCB
    assert [e['action'] for e in spikes.events] == ['rollback'] and spikes.skipped == [[0, 8, 1, 1]]  # read at pass 1's 2nd batch
    assert (straight.clock.step, straight.clock.micro_step, straight.EMACB.n_averaged) == (14, 28, 14)
    resumed = mk(tmp_path/'b')
    resumed.fit(steps=14, valid_every=7, lr=0.05, resume_from=tmp_path/'a'/'checkpoint_step_000012.pt')
    for k, v in straight.model.state_dict().items(): assert torch.equal(v, resumed.model.state_dict()[k]), k
    for k, v in straight.EMACB.averaged_state().items(): assert torch.equal(v, resumed.EMACB.averaged_state()[k]), k
    assert resumed.LossSpikeCB.skipped == spikes.skipped and resumed.opt.param_groups[0]['lr'] == 0.025

@pytest.mark.parametrize('at', [12, 14])
def test_a_resume_rolls_back_to_the_snapshot_the_uninterrupted_run_had(tmp_path, at):
    "The snapshot is in the checkpoint: resumed after batch 12 (snapshot after batch 7) or 14 (between the spike at 13 and the check at 16 that reads it), the rollback goes back where the uninterrupted run went"
    def mk(d, **kw): return make(LossSpikeCB('rollback', warmup=3, check_every=4, snapshot_every=8, **kw), Spike(13),
                                 CheckpointCB(d, every_n_batches=2, keep_last=None))
    straight = mk(tmp_path/'a')
    straight.fit(1, lr=0.05, valid=False)
    assert straight.LossSpikeCB.skipped == [[0, 8, 0, 15]]
    resumed = mk(tmp_path/'b')
    resumed.fit(1, lr=0.05, valid=False, resume_from=tmp_path/'a'/f'checkpoint_0000_{at:06d}.pt')
    for k, v in straight.model.state_dict().items(): assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert resumed.LossSpikeCB.skipped == straight.LossSpikeCB.skipped and resumed.LossSpikeCB.events == straight.LossSpikeCB.events
    small = mk(tmp_path/'c', snapshot_in_checkpoint=False)  # checkpoints without it: a state's size smaller, the limit stated
    small.fit(1, lr=0.05, valid=False)
    big, little = (torch.load(d/f'checkpoint_0000_{at:06d}.pt', weights_only=True)['callbacks']['LossSpikeCB'] for d in (tmp_path/'a', tmp_path/'c'))
    assert 'snapshot' in big and big['snapshot']['start'] == [0, 8] and 'snapshot' not in little

def test_a_rollback_lowers_a_sequential_schedule_inside_and_a_plateau_schedule_without_base_rates():
    "Warm-up then cosine as torch writes it (`SequentialLR`): every later step's rate is the schedule's x0.5, after its milestone too; `ReduceLROnPlateau` (no `base_lrs`) is rolled back too (before: an `AttributeError` in the rollback)"
    from torch.optim.lr_scheduler import SequentialLR, LinearLR, CosineAnnealingLR, ReduceLROnPlateau
    from aisaac.callbacks.schedule import PlateauSchedulerCB
    from aisaac.callbacks.metrics import MetricsCB
    sched = lambda opt: SequentialLR(opt, [LinearLR(opt, 0.1, 1.0, total_iters=8), CosineAnnealingLR(opt, T_max=16)], milestones=[8])
    def run(*cbs):
        w = Watch()
        make(BatchSchedulerCB(sched), LossSpikeCB(check_every=1, snapshot_every=1, warmup=3, grads=False), *cbs, w).fit(1, lr=0.05, valid=False)
        return w.lrs
    straight, spiked = run(), run(Spike(5))
    assert len(spiked) == len(straight) - 1  # the spike's step undone
    for step, lr in enumerate(spiked[5:], 5): assert math.isclose(lr, 0.5 * straight[step], rel_tol=1e-6), (step, lr, straight[step])
    t = make(MetricsCB(show=False), PlateauSchedulerCB(patience=100), LossSpikeCB(check_every=1, snapshot_every=1, warmup=3), Spike(10))
    t.fit(1, lr=0.05)
    assert [e['action'] for e in t.LossSpikeCB.events] == ['rollback'] and t.opt.param_groups[0]['lr'] == 0.025

class Losses(Callback):
    "Each training batch's loss (after `Spike`) by `(pass, batch)`, and its gradient norm"
    order = 60
    def before_fit(self, t): self.loss, self.norm = {}, {}
    def after_loss(self, t):
        if t.model.training: self.loss[(t.epoch, t.batch_num)] = t.loss.item()
    def after_backward(self, t):
        self.norm[(t.epoch, t.batch_num)] = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in t.model.parameters()])).item()

def kept_batches(losses, skipped):
    "The training batches whose steps are in the trajectory kept: those `skipped` does not name"
    void = lambda at: any(tuple(r[:2]) <= at <= tuple(r[2:]) for r in skipped)
    return [at for at in losses.loss if not void(at)]

def recorders(tmp_path):
    from aisaac.callbacks.metrics import MetricsCB
    from aisaac.callbacks.monitors import LRMonitorCB, GradNormCB
    from aisaac.callbacks.loggers import CSVLogger, JSONLinesLogger
    from aisaac.learner import RecorderCB
    return [MetricsCB(show=False), LRMonitorCB(), GradNormCB(per_layer=False), CSVLogger(tmp_path/'batches.csv', per='batch'),
            JSONLinesLogger(tmp_path/'log.jsonl'), RecorderCB(loss=lambda cb: cb.trainer.loss), Losses()]

def check_records(t, tmp_path, n_kept, per_step:int=1): # `per_step`: the batches of an accumulation window
    "The epoch's loss, the history, the monitors and the loggers hold the batches kept, and only them (the gradients' norms: the steps kept, at their windows' last batches)"
    import csv, json
    losses, spikes = t.Losses, t.LossSpikeCB
    kept = kept_batches(losses, spikes.skipped)
    assert len(kept) == n_kept
    stepped = [k for k in kept if (k[1] + 1) % per_step == 0]  # (one epoch: its batches are the clock's)
    h = t.history
    assert h.get_metric_values('train_loss', 'batch') == pytest.approx([losses.loss[k] for k in kept], rel=1e-6)
    assert h.get_latest_metric('train_loss') == pytest.approx(sum(losses.loss[k] for k in kept) / len(kept), rel=1e-5)
    assert len(t.LRMonitorCB.recs['lr']) == len(h.get_metric_values('lr', 'batch')) == t.clock.step
    assert [float(v) for v in t.RecorderCB.recs['loss']] == pytest.approx([losses.loss[k] for k in kept], rel=1e-6)  # miniai's recorder
    assert h.get_metric_values('grad_norm', 'batch') == pytest.approx([losses.norm[k] for k in stepped], rel=1e-5)
    rows = h.get_metric_steps('train_loss', 'batch')  # a step's rate and norm in the row of its last batch's loss (before: the losses renumbered 0, 1, 2... past a void batch)
    assert set(h.get_metric_steps('lr', 'batch')) <= set(rows) and set(h.get_metric_steps('grad_norm', 'batch')) <= set(rows), (rows, h.get_metric_steps('lr', 'batch'))
    lines = [json.loads(l) for l in (tmp_path/'log.jsonl').read_text().splitlines()]
    norms = [(l['step'], l['grad_norm']) for l in lines if 'grad_norm' in l]
    assert [v for _, v in norms] == pytest.approx([losses.norm[k] for k in stepped], rel=1e-5)  # each kept step's norm once, no void one
    assert [s for s, _ in norms] == h.get_metric_steps('grad_norm', 'batch')
    rows = list(csv.DictReader(open(tmp_path/'batches.csv')))
    assert [float(r['grad_norm']) for r in rows if r['grad_norm']] == pytest.approx([losses.norm[k] for k in stepped], rel=1e-5)
    return kept

def test_a_rollback_leaves_only_the_kept_trajectory_in_the_records(tmp_path):
    "Batches 8 to 15 are undone: the epoch's loss is the 16 kept batches' mean (before: 9852, the undone batch 15's loss counted), 16 batch losses (before: 17), 16 rates (before: 23), 16 norms sent to the loggers (before: 24); the history says where and how many"
    spikes = LossSpikeCB('rollback', warmup=3, check_every=4, snapshot_every=8)
    t = make(spikes, Spike(13), *recorders(tmp_path))
    t.fit(1, lr=0.1, valid=False)
    assert spikes.skipped == [[0, 8, 0, 15]] and t.clock.step == 16
    kept = check_records(t, tmp_path, 16)
    assert kept == [(0, b) for b in (*range(8), *range(16, 24))]
    assert t.LRMonitorCB.recs['lr'] == [0.1] * 8 + [0.05] * 8
    assert t.history.get_metric_steps('void_batches', 'batch') == [8] and t.history.get_metric_values('void_batches', 'batch') == [8]

def test_a_skipped_batch_is_left_out_of_the_records(tmp_path):
    "The spike's batch 10 is not trained on: it is out of the epoch's loss (before: 893.5, its loss counted), of the batch losses (before: 24 of them) and of the norms; the history says which"
    t = make(LossSpikeCB('skip', warmup=3), Spike(10), *recorders(tmp_path))
    t.fit(1, lr=0.05, valid=False)
    assert t.LossSpikeCB.skipped == [[0, 10, 0, 10]] and t.clock.step == 23
    check_records(t, tmp_path, 23)
    assert t.history.get_metric_steps('train_loss', 'batch') == [b for b in range(24) if b != 10]  # the clock's rows: batch 10's is void
    assert t.history.get_metric_steps('void_batches', 'batch') == [10] and t.history.get_metric_values('void_batches', 'batch') == [1]

def test_a_skipped_accumulation_window_is_left_out_of_the_records(tmp_path):
    "Three batches a step, the spike at batch 10: batches 9 to 11 are not trained on, and none of them is in the records (before: 9 and 10 were, the spike's loss among them)"
    t = make(GradAccumCB(3), LossSpikeCB('skip', warmup=2), Spike(10), *recorders(tmp_path))
    t.fit(1, lr=0.05, valid=False)
    assert t.LossSpikeCB.skipped == [[0, 9, 0, 11]] and t.clock.step == 7
    check_records(t, tmp_path, 21, per_step=3)
    assert t.history.get_metric_values('void_batches', 'batch') == [3]

class NaN(Callback):
    "A NaN loss at training batch `batch`"
    order = -1
    def __init__(self, batch): self.batch = batch
    def after_loss(self, t):
        if t.model.training and t.batch_num == self.batch: t.loss = t.loss * float('nan')

@pytest.mark.parametrize('at', [0, 1, 2])
def test_a_nan_in_the_warm_up_does_not_count_toward_it(at):
    "The median is compared with after `warmup` clean losses: a NaN among the first three is skipped alone (before: at batch 1, two clean batches were skipped too, compared with the median of two losses)"
    w = Watch()
    make(LossSpikeCB('skip', warmup=3), NaN(at), w).fit(1, lr=0.05, valid=False)
    assert len(w.skips) == 1 and 'not finite' in w.skips[0], w.skips

@pytest.mark.parametrize('how', ['rollback', 'skip', 'window'])
def test_the_live_loss_graph_keeps_only_the_kept_batches(tmp_path, how):
    """ProgressCB(plot=True)'s graph did not honour `void_batches`: after the rollback of batches 8 to 15 it kept 23 points for 16 batches
    trained (the undone batches' losses, the spike's among them); in a skipped accumulation window of 3, 23 for 21 (batches 9 and 10). A
    skipped single batch was already left out (it ends before `after_batch`): 23 for 23. Its points must be the kept batches' losses"""
    from aisaac.callbacks.progress import ProgressCB
    spikes, cbs, n = {'rollback': (LossSpikeCB('rollback', warmup=3, check_every=4, snapshot_every=8), [Spike(13)], 16),
                      'skip': (LossSpikeCB('skip', warmup=3), [Spike(10)], 23),
                      'window': (LossSpikeCB('skip', warmup=2), [GradAccumCB(3), Spike(10)], 21)}[how]
    progress = ProgressCB(plot=True, bars=False)
    t = make(spikes, *cbs, progress, *recorders(tmp_path))
    t.fit(1, lr=0.1 if how == 'rollback' else 0.05, valid=False)
    kept = check_records(t, tmp_path, n, per_step=3 if how == 'window' else 1)
    assert progress.losses == pytest.approx([t.Losses.loss[k] for k in kept], rel=1e-6)
