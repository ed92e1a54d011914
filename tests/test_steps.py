"""Runs measured in optimizer steps and steps that tell the truth: `fit(steps=, valid_every=)`, the clock, `step_skipped`,
schedulers and monitors keyed on applied steps, `Every`, `request_stop`, and exact resume inside a run of steps."""
import math
import pytest, torch
from torch import nn
from aisaac.clock import Clock, Every
from aisaac.core.callback import Callback, CancelStepException
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.gradients import GradAccumCB, GradClipCB
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.callbacks.schedule import OneCycleSchedulerCB
from aisaac.callbacks.monitors import LRMonitorCB, SpeedMonitorCB
from aisaac.callbacks.savers import CheckpointCB, checkpoints
from checkpoint_run import make_trainer, result
import tiny

class Steps(Callback):
    "Records the clock at each event of interest"
    def __init__(self): self.applied, self.skipped, self.passes = [], [], []
    def after_step(self, t): self.applied.append(t.clock.step)
    def step_skipped(self, t, reason): self.skipped.append(reason)
    def after_train(self, t): self.passes.append((t.epoch, t.clock.step))

# ---------------------------------------------------------------- a run of N steps
@pytest.mark.parametrize('accum', [1, 3])
def test_a_fit_of_n_steps_ends_after_exactly_n_applied_steps_across_epochs(accum):
    "13 batches per epoch; 30 steps cross epochs (and, accumulating 3 batches a step, 90 batches: 7 epochs)"
    t = make_trainer(callbacks=[rec := Steps(), *([GradAccumCB(accum)] if accum > 1 else [])])
    t.fit(steps=30)
    assert t.clock.step == 30 and rec.applied == list(range(1, 31))
    assert t.clock.micro_step == 30 * accum and t.clock.epoch == 30 * accum // len(t.dls.train)
    assert len(rec.skipped) == 30 * (accum - 1) and all(r.startswith('gradient accumulation: batch') for r in rec.skipped)
    assert t.clock.samples == sum(len(b[0]) for _, b in zip(range(30 * accum), _cycle(t.dls.train)))

def _cycle(dl):
    while True: yield from dl

def test_validation_every_k_steps_logs_at_those_steps():
    "valid_every=8 of 30 steps: passes end at steps 8, 16, 24 and 30, and each validation is recorded at its step"
    rows = []
    grab = type('Grab', (Callback,), {'log_metrics': lambda self, tr, metrics: rows.append(metrics)})()
    t = make_trainer(callbacks=[rec := Steps(), grab])
    t.fit(steps=30, valid_every=8)
    assert rec.passes == [(0, 8), (1, 16), (2, 24), (3, 30)]
    assert t.history.get_metric_steps('valid_loss') == [8, 16, 24, 30]
    assert t.history.get_metric_steps('train_loss') == [8, 16, 24, 30]
    assert [m['step'] for m in rows] == [8, 16, 24, 30]  # the table's rows, by step

def test_a_second_fit_of_steps_takes_as_many_more():
    t = make_trainer()
    t.fit(steps=10); t.fit(steps=5)
    assert t.clock.step == 15

def test_bad_step_arguments_say_what_to_pass():
    t = make_trainer()
    with pytest.raises(ValueError, match='`steps` is how many optimizer steps'): t.fit(steps=0)
    with pytest.raises(ValueError, match='give `steps=` too'): t.fit(2, valid_every=10)
    with pytest.raises(ValueError, match='a number of optimizer steps'): t.fit(steps=10, valid_every='1 epoch')
    with pytest.raises(ValueError, match='trains none'): t.fit(steps=10, train=False)

# ---------------------------------------------------------------- steps that tell the truth
class InfGradAt(Callback):
    "Makes one parameter's gradient infinite at the given training batches (counted from 1), before the step"
    order = -20
    def __init__(self, batches): self.batches = set(batches)
    def before_step(self, t):
        if t.clock.micro_step in self.batches: next(t.model.parameters()).grad.fill_(float('inf'))

def test_float16_skipped_steps_fire_step_skipped_and_do_not_count():
    "The gradient scaler skips the steps with inf gradients: no after_step, no count, a reason; schedulers and LRMonitorCB see applied steps only"
    t = make_trainer(callbacks=[rec := Steps(), MixedPrecisionCB(torch.float16), InfGradAt([2, 5]), lr := LRMonitorCB()])
    t.fit(1, valid=False)
    n = len(t.dls.train)
    assert t.clock.micro_step == n and t.clock.step == n - 2 and rec.applied == list(range(1, n - 1))
    assert len(rec.skipped) == 2 and all('inf or NaN' in r for r in rec.skipped)
    assert len(lr.recs['lr']) == n - 2 and t.history.get_metric_steps('lr', per='batch') == [b for b in range(n) if b not in (1, 4)]  # the applied steps' batches' rows

def test_one_cycle_follows_the_applied_steps_under_accumulation():
    "Its length is the fit's applied optimizer steps (26 batches over 2 epochs // 3 = 8: windows cross epochs, the leftover is dropped), and it moves once per applied step"
    t = make_trainer(callbacks=[GradAccumCB(3), lr := LRMonitorCB()])  # make_trainer has OneCycleSchedulerCB
    t.fit(2, lr=0.01, valid=False)
    n_steps = 2 * len(t.dls.train) // 3
    assert t.OneCycleSchedulerCB.scheduler.total_steps == n_steps == t.planned_steps() == t.clock.step == 8
    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=0.01)
    ref = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=n_steps)
    want = []
    for _ in range(t.clock.step): want.append(opt.param_groups[0]['lr']); opt.step(); ref.step()
    assert lr.recs['lr'] == pytest.approx(want)

def test_a_cancelled_step_without_a_message_names_who_cancelled():
    class Skip(Callback):
        def before_step(self, t): raise CancelStepException()
    t = tiny.make_trainer([rec := Steps(), Skip()])
    t.fit(1, valid=False)
    assert t.clock.step == 0 and rec.skipped and all(r == 'cancelled by Skip.before_step' for r in rec.skipped)

# ---------------------------------------------------------------- every N of the clock
def test_checkpoints_every_n_steps_and_every_n_tokens(tmp_path):
    t = make_trainer(callbacks=[CheckpointCB(tmp_path/'a', every_n_epochs=None, every='7 steps', keep_last=None)])
    t.fit(steps=30, valid_every=10)
    assert len(checkpoints(tmp_path/'a')) == 4  # steps 7, 14, 21, 28
    ids = [{'input_ids': torch.randint(0, 50, (4, 16)), 'labels': torch.randint(0, 50, (4, 16))} for _ in range(6)]
    class LM(nn.Module):
        def __init__(self): super().__init__(); self.emb = nn.Embedding(50, 50)
        def forward(self, x): return self.emb(x)
    lm_loss = lambda logits, y: nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    t = Trainer(tiny.types.SimpleNamespace(train=ids, valid=ids[:1]), lm_loss, torch.optim.SGD, LM(),
                callbacks=[BasicTrainCB(), CheckpointCB(tmp_path/'b', every_n_epochs=None, every='128 tokens', keep_last=None)])
    t.fit(2)
    assert t.clock.tokens == 12 * 64 and len(checkpoints(tmp_path/'b')) == 6  # 64 tokens a batch: every second batch

def test_every_reads_the_units_people_write():
    assert Every('2k steps') == Every(2000) and Every('1.5h') == Every(5400.0, 'seconds') and Every('3 ep') == Every(3, 'epoch')

# ---------------------------------------------------------------- stopping and resuming
def test_exact_resume_inside_a_run_of_steps(tmp_path):
    "A checkpoint at step 17 (inside a pass, inside the loader's second epoch), resumed in a fresh trainer, ends as the straight run"
    straight = make_trainer(callbacks=[CheckpointCB(tmp_path, every_n_epochs=None, every='17 steps', keep_last=None)])
    straight.fit(steps=40, valid_every=12)
    ckpt = checkpoints(tmp_path)[0]
    state = torch.load(ckpt, weights_only=True)
    assert state['clock']['step'] == 17 and state['stream']['n'] == 17 - 13 and state['batch'] == 17 - 12
    resumed = make_trainer(callbacks=[CheckpointCB(tmp_path/'r', every_n_epochs=None, every='17 steps', keep_last=None)])
    resumed.fit(steps=40, valid_every=12, resume_from=ckpt)
    a, b = result(straight), result(resumed)
    for k in a['model']: assert torch.equal(a['model'][k], b['model'][k]), k
    assert a['history'] == b['history'] and resumed.clock.step == 40 and resumed.clock.epoch == straight.clock.epoch
    assert [p.name for p in checkpoints(tmp_path/'r')] == [p.name for p in checkpoints(tmp_path)][1:]

def test_resuming_a_run_of_steps_with_other_passes_is_refused(tmp_path):
    t = make_trainer(callbacks=[CheckpointCB(tmp_path, every_n_epochs=None, every='5 steps')])
    t.fit(steps=10, valid_every=5)
    with pytest.raises(Exception, match='valid_every=5'): make_trainer().fit(steps=10, valid_every=4, resume_from=checkpoints(tmp_path)[0])
    with pytest.raises(Exception, match='measured in steps'): make_trainer().fit(3, resume_from=checkpoints(tmp_path)[0])

def test_speed_monitor_reports_tokens_per_second_for_batches_of_tokens():
    ids = [{'input_ids': torch.randint(0, 50, (4, 16)), 'labels': torch.randint(0, 50, (4, 16))} for _ in range(6)]
    class LM(nn.Module):
        def __init__(self): super().__init__(); self.emb = nn.Embedding(50, 50)
        def forward(self, x): return self.emb(x)
    lm_loss = lambda logits, y: nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    t = Trainer(tiny.types.SimpleNamespace(train=ids, valid=ids[:1]), lm_loss, torch.optim.SGD, LM(),
                callbacks=[BasicTrainCB(), sp := SpeedMonitorCB(window_size=2)])
    t.fit(1)
    tps, sps = t.history.get_latest_metric('tokens_per_sec', 'batch'), t.history.get_latest_metric('samples_per_sec', 'batch')
    assert tps == pytest.approx(sps * 16)  # 16 tokens a sample
    assert t.history.get_latest_metric('epoch_tokens_per_sec') == pytest.approx(6 * 64 / t.history.get_latest_metric('train_time'))

@pytest.mark.parametrize('at', [10, 15])
def test_a_resume_at_the_end_of_an_interval_keeps_the_random_draws_of_its_validation(tmp_path, at):
    "A checkpoint at step 10 (an interval's end, before its validation, whose `DataLoader` draws a seed from the global generator), or at 15 (inside one): the resumed run's dropout and data order are the straight run's"
    from torch.utils.data import DataLoader, TensorDataset
    from aisaac.data import DataLoaders
    g = torch.Generator().manual_seed(0)
    x = torch.randn(52, 4, generator=g); y = x.sum(1, keepdim=True)
    def run(d, resume=None):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        dls = DataLoaders(DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True), DataLoader(TensorDataset(x[:8], y[:8]), batch_size=4))
        t = Trainer(dls, nn.MSELoss(), torch.optim.Adam, model, callbacks=[BasicTrainCB(), CheckpointCB(d, every_n_epochs=None, every='5 steps', keep_last=None)])
        t.fit(steps=30, valid_every=10, lr=1e-2, resume_from=resume)
        return torch.cat([p.detach().flatten() for p in t.model.parameters()])
    straight = run(tmp_path/'a')
    assert torch.equal(run(tmp_path/'b', tmp_path/'a'/f'checkpoint_step_{at:06d}.pt'), straight)

_corpus = torch.randint(0, 20, (400,), generator=torch.Generator().manual_seed(0))

class Windows:
    "nanoGPT's loader, as most hand-written language-model loaders: each batch 4 random windows, drawn with `torch.randint` from PyTorch's global generator"
    def __init__(self, n=None): self.n = n  # batches an epoch; `None`: endless
    def __len__(self): return self.n
    def __iter__(self):
        k = 0
        while self.n is None or k < self.n:
            k += 1
            yield self.batch(torch.randint(len(_corpus) - 9, (4,)))
    @staticmethod
    def batch(ix): return torch.stack([_corpus[i:i + 8] for i in ix]), torch.stack([_corpus[i + 1:i + 9] for i in ix])

class Pool(Windows):
    "A loader that draws a pool of 16 windows every 4 batches and takes its batches from it: later batches depend on its earlier draws"
    def __init__(self, n, generator=None): self.n, self.gen = n, generator
    def __iter__(self):
        for k in range(self.n):
            if k % 4 == 0: pool = torch.randint(len(_corpus) - 9, (16,), generator=self.gen)
            yield self.batch(pool[k % 4 * 4:][:4])

class StepLosses(Callback):
    "Each training batch's loss, by the clock's step"
    order = 60
    def before_fit(self, t): self.at = {}
    def after_batch(self, t):
        if t.model.training: self.at[(t.clock.step, t.clock.micro_step)] = t.loss.item()

def _lm_run(d, train, resume=None, steps=True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 16), nn.Dropout(0.2), nn.Linear(16, 20))  # dropout draws from the global generator too
    lm = lambda logits, y: nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    every = dict(every='5 steps') if steps else dict(every_n_batches=5)
    t = Trainer(tiny.types.SimpleNamespace(train=train(), valid=Windows(3)), lm, torch.optim.AdamW, model,
                callbacks=[BasicTrainCB(), rec := StepLosses(), CheckpointCB(d, every_n_epochs=None, keep_last=None, **every)])
    if steps: t.fit(steps=45, valid_every=10, lr=1e-2, resume_from=resume)
    else: t.fit(3, lr=1e-2, resume_from=resume)
    return rec.at

@pytest.mark.parametrize('at', [10, 15])
def test_a_loader_drawing_each_batch_from_the_global_generator_resumes_to_the_same_batches(tmp_path, at):
    "nanoGPT's loader (random windows from the global generator, endless), validation drawing from it too, dropout: resumed after step 10 (before its validation) or 15 (inside an interval), every later loss is the straight run's: the replay puts the random states back as the checkpoint saw them, after the dropped batches"
    straight = _lm_run(tmp_path/'a', Windows)
    with pytest.warns(UserWarning, match='replays'): resumed = _lm_run(tmp_path/'b', Windows, tmp_path/'a'/f'checkpoint_step_{at:06d}.pt')
    assert len(resumed) == 45 - at and all(straight[k] == v for k, v in resumed.items())

def test_a_loader_drawing_each_batch_from_the_global_generator_resumes_an_epoch_to_the_same_batches(tmp_path):
    "The same in a run of epochs of 20 batches, resumed after batch 15 of the second"
    straight = _lm_run(tmp_path/'a', lambda: Windows(20), steps=False)
    resumed = _lm_run(tmp_path/'b', lambda: Windows(20), tmp_path/'a'/'checkpoint_0001_000015.pt', steps=False)
    assert len(resumed) == 25 and all(straight[k] == v for k, v in resumed.items())

def test_a_loader_whose_batches_depend_on_its_earlier_global_draws_is_told_to_take_a_generator(tmp_path):
    "A pool refilled from the global generator: the replay refills it without what dropout and validation drew in between, so the batches differ, and the warning says so and what to do; with a generator of its own the replay is exact"
    straight = _lm_run(tmp_path/'a', lambda: Pool(40))
    with pytest.warns(UserWarning, match="they differ when its batches depend on its own earlier draws.*a `torch.Generator` of its own"):
        resumed = _lm_run(tmp_path/'b', lambda: Pool(40), tmp_path/'a'/'checkpoint_step_000015.pt')
    assert sum(straight[k] == v for k, v in resumed.items()) == 0  # (the pool drawn at batch 12 differs: batches 15 on, and the weights after)
    straight = _lm_run(tmp_path/'c', lambda: _with_gen(Pool(40)))
    resumed = _lm_run(tmp_path/'d', lambda: _with_gen(Pool(40)), tmp_path/'c'/'checkpoint_step_000015.pt')
    assert len(resumed) == 30 and all(straight[k] == v for k, v in resumed.items())

def _with_gen(pool):
    "`pool` drawing from a generator of its own, as its `generator` attribute (the checkpoints keep its state)"
    pool.generator = pool.gen = torch.Generator().manual_seed(1)
    return pool

# ---------------------------------------------------------------- validating before the first step (nanoGPT evaluates at iter 0)
def test_valid_first_validates_before_the_first_step_at_step_0():
    "fit(steps=30, valid_every=8, valid_first=True): a validation of the untrained model at step 0, then the usual ones; the table's first row is step 0"
    rows = []
    grab = type('Grab', (Callback,), {'log_metrics': lambda self, tr, metrics: rows.append(dict(metrics))})()
    t = make_trainer(callbacks=[rec := Steps(), grab])
    with torch.no_grad():
        x, y = torch.cat([b[0] for b in t.dls.valid]), torch.cat([b[1] for b in t.dls.valid])
        untrained = nn.CrossEntropyLoss()(t.model.eval()(x), y).item()
    t.fit(steps=30, valid_every=8, valid_first=True)
    assert rec.passes == [(0, 8), (1, 16), (2, 24), (3, 30)]
    assert t.history.get_metric_steps('valid_loss') == [0, 8, 16, 24, 30] and t.history.get_metric_steps('train_loss') == [8, 16, 24, 30]
    assert t.history.get_metric_values('valid_loss')[0] == pytest.approx(untrained, abs=1e-6)
    assert [m['step'] for m in rows] == [0, 8, 16, 24, 30] and list(rows[0]) == list(rows[1])  # the same columns: the train loss empty at step 0
    assert rows[0]['train'] is None

def test_valid_first_needs_a_run_of_steps_that_validates():
    t = make_trainer()
    with pytest.raises(ValueError, match='valid_first.*give `steps=`'): t.fit(2, valid_first=True)
    with pytest.raises(ValueError, match='valid_first.*valid=False'): t.fit(steps=5, valid=False, valid_first=True)

def test_valid_first_resumes_exactly_without_validating_again(tmp_path):
    "A checkpoint at step 17 of a run that validated first: the resumed run (valid_first too) does not validate at 17, and ends as the straight run"
    straight = make_trainer(callbacks=[CheckpointCB(tmp_path, every_n_epochs=None, every='17 steps', keep_last=None)])
    straight.fit(steps=40, valid_every=12, valid_first=True)
    resumed = make_trainer(callbacks=[CheckpointCB(tmp_path/'r', every_n_epochs=None, every='17 steps', keep_last=None)])
    resumed.fit(steps=40, valid_every=12, valid_first=True, resume_from=checkpoints(tmp_path)[0])
    a, b = result(straight), result(resumed)
    for k in a['model']: assert torch.equal(a['model'][k], b['model'][k]), k
    assert a['history'] == b['history'] and straight.history.get_metric_steps('valid_loss') == [0, 12, 24, 36, 40]
