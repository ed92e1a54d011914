"""Several evaluation sets (`EvalSetsCB`, issue 39): named validation loaders, each with its own metrics and interval, recorded as
`name/metric` in the history, the table and the loggers' files; watched by savers and stoppers; in runs measured in steps, after a
resume, with averaged weights, and on 2 processes (torchrun, gloo)."""
import csv, json, re, sys, types
from pathlib import Path
import pytest, torch
from torch import nn
from torcheval.metrics import MulticlassAccuracy

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import torchrun_cases
from aisaac.trainer import Trainer
from aisaac.core.callback import Callback
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB

def batches(n, seed, shift=0., bs=16):
    "`n` batches of `bs` points in 2-D, labelled by the sign of the first coordinate (moved by `shift`)"
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n * bs, 2, generator=g)
    return [(x[i:i+bs] + shift, (x[i:i+bs, 0] > 0).long()) for i in range(0, n * bs, bs)]

def trainer(*cbs, metrics=True):
    "A classifier on 6 training batches, validated on 2, with MetricsCB (its accuracy) and `cbs`"
    from aisaac.callbacks.metrics import MetricsCB
    torch.manual_seed(0)
    m = MetricsCB(Accuracy=MulticlassAccuracy(), show=False) if metrics else MetricsCB(show=False)
    return Trainer(types.SimpleNamespace(train=batches(6, 0), valid=batches(2, 1)), nn.CrossEntropyLoss(), torch.optim.SGD,
                   nn.Linear(2, 2), callbacks=[BasicTrainCB(), m, *cbs])

def two_sets(every_b=2):
    "Set `a` evaluated whenever the fit validates, with MetricsCB's accuracy; set `b` every `every_b` (epochs, or steps), its loss and a metric of its own"
    from aisaac.evals import EvalSetsCB, Eval
    return EvalSetsCB(a=batches(2, 2, shift=0.5), b=Eval(batches(1, 3), every=every_b, metrics={'acc': MulticlassAccuracy()}))

def steps_of(t, *names): return {n: t.history.get_metric_steps(n) for n in names}

# ---------------------------------------------------------------- the sets, each on its interval

def test_two_sets_each_on_its_interval_in_a_run_of_epochs():
    """`a` every epoch, `b` every 2 epochs and at the last: the history has each set's loss and metrics at those epochs (5 epochs: b at
    1, 3 and 4), `dls.valid`'s names unchanged; `a`'s accuracy is that of its own data (a copy of MetricsCB's metric), `b` has its own"""
    t = trainer(two_sets())
    t.fit(5, lr=0.5)
    assert steps_of(t, 'valid_loss', 'Accuracy', 'a/valid_loss', 'a/Accuracy', 'b/valid_loss', 'b/acc') == {
        'valid_loss': [0, 1, 2, 3, 4], 'Accuracy': [0, 1, 2, 3, 4], 'a/valid_loss': [0, 1, 2, 3, 4], 'a/Accuracy': [0, 1, 2, 3, 4],
        'b/valid_loss': [1, 3, 4], 'b/acc': [1, 3, 4]}
    assert t.history.metric_names == ['train_loss', 'valid_loss', 'Accuracy', 'a/valid_loss', 'a/Accuracy', 'b/valid_loss', 'b/acc']
    with torch.no_grad():  # the last epoch's figures are those of each set's own data
        for name, data in (('a', t.EvalSetsCB.eval_sets['a'].loader), ('b', t.EvalSetsCB.eval_sets['b'].loader)):
            x, y = torch.cat([b[0] for b in data]), torch.cat([b[1] for b in data])
            assert abs(t.history.get_latest_metric(f'{name}/valid_loss') - nn.CrossEntropyLoss()(t.model(x), y).item()) < 1e-5
            acc = (t.model(x).argmax(1) == y).float().mean().item()
            assert abs(t.history.get_latest_metric('a/Accuracy' if name == 'a' else 'b/acc') - acc) < 1e-6
    assert len(t.MetricsCB.metrics_epoch) == 5 and list(t.MetricsCB.metrics_epoch[0]) == ['Accuracy']  # AIsaac's records: dls.valid's

def test_two_sets_each_on_its_interval_in_a_run_of_steps():
    "fit(steps=15, valid_every=3): `a` at every validation, `b` every 6 steps and at the end; an interval between two validations is refused"
    t = trainer(two_sets(every_b='6 steps'))
    t.fit(steps=15, valid_every=3, lr=0.5)
    assert steps_of(t, 'valid_loss', 'a/valid_loss', 'b/valid_loss', 'b/acc') == {
        'valid_loss': [3, 6, 9, 12, 15], 'a/valid_loss': [3, 6, 9, 12, 15], 'b/valid_loss': [6, 12, 15], 'b/acc': [6, 12, 15]}
    t = trainer(two_sets(every_b=6))  # a number counts the fit's unit: steps here
    t.fit(steps=15, valid_every=3, lr=0.5)
    assert t.history.get_metric_steps('b/valid_loss') == [6, 12, 15]
    with pytest.raises(ValueError, match=r"evaluated every 4 steps, and this fit validates every 3.*multiple of 3"):
        trainer(two_sets(every_b='4 steps')).fit(steps=15, valid_every=3)

def test_valid_first_in_a_run_of_one_interval_is_not_its_last_validation():
    """fit(steps=4, valid_every=4, valid_first=True): its first validation (step 0) is also in its last interval, and `b` (every 8 steps,
    so due only at the end) was evaluated there too: b/valid_loss at 0 and 4; with several intervals it was already right"""
    t = trainer(two_sets(every_b='8 steps'))
    t.fit(steps=4, valid_every=4, valid_first=True, lr=0.5)
    assert steps_of(t, 'valid_loss', 'a/valid_loss', 'b/valid_loss') == {'valid_loss': [0, 4], 'a/valid_loss': [0, 4], 'b/valid_loss': [4]}

def test_an_interval_in_tokens_or_samples_is_due_at_the_first_validation_after_it():
    "Every('100 samples'): 96 training samples an epoch, so due after epochs 1, 2, 3 (192, 288, 384 samples) and at the last"
    from aisaac.evals import EvalSetsCB, Eval
    t = trainer(EvalSetsCB(b=Eval(batches(1, 3), every='100 samples')))
    t.fit(5, lr=0.5)
    assert t.history.get_metric_steps('b/valid_loss') == [1, 2, 3, 4]

def test_the_passes_come_in_order_each_a_validate_phase_naming_its_set():
    "Each set's pass is a `validate` phase after dls.valid's, before the epoch's checkpoint: `trainer.eval_set` names it, `last_pass` ends the epoch"
    from aisaac.evals import last_pass, first_pass
    class Passes(Callback):
        def before_fit(self, t): self.seen = []
        def before_validate(self, t): self.seen.append(('before_validate', getattr(t.eval_set, 'name', None), first_pass(t)))
        def after_epoch(self, t): self.seen.append(('after_epoch', 'train' if t.training else getattr(t.eval_set, 'name', 'valid'), last_pass(t)))
        def checkpoint(self, t, at):
            if at == 'epoch': self.seen.append(('checkpoint', sorted(t.evals_done)))
    p = Passes()
    t = trainer(two_sets(), p)
    t.fit(2, lr=0.5)
    assert p.seen == [('after_epoch', 'train', False), ('before_validate', None, False), ('after_epoch', 'valid', False),
                      ('before_validate', 'a', False), ('after_epoch', 'a', True), ('checkpoint', ['a']),
                      ('after_epoch', 'train', False), ('before_validate', None, False), ('after_epoch', 'valid', False),
                      ('before_validate', 'a', False), ('after_epoch', 'a', False), ('before_validate', 'b', False), ('after_epoch', 'b', True),
                      ('checkpoint', ['a', 'b'])]
    assert t.eval_set is None and t.evals_left == []
    t.fit(1, train=False)  # a fit that only validates: every set, at its last (only) epoch; dls.valid's pass is its first
    assert [s for s in p.seen if s[0] == 'before_validate'] == [('before_validate', None, True), ('before_validate', 'a', False), ('before_validate', 'b', False)]

def test_a_set_given_for_one_fit_only_and_sets_of_one_name_refused():
    from aisaac.evals import EvalSetsCB
    t = trainer()
    t.fit(1, lr=0.5, callbacks=[EvalSetsCB(a=batches(1, 2))])
    t.fit(1, lr=0.5)
    assert t.history.get_metric_steps('a/valid_loss') == [0] and t.history.get_metric_steps('valid_loss') == [0, 1]
    with pytest.raises(ValueError, match="Two evaluation sets are named 'a'"):
        t.fit(1, callbacks=[EvalSetsCB(a=batches(1, 2)), EvalSetsCB(a=batches(1, 3))])

# ---------------------------------------------------------------- the table and the loggers

def test_the_table_has_a_column_per_set_empty_where_it_was_not_evaluated(capsys):
    from aisaac.callbacks.progress import ProgressCB, PrintProgressCB
    t = trainer(two_sets(), ProgressCB(bars=False))
    t.fit(3, lr=0.5)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ['epoch', 'train', 'valid', 'Accuracy', 'a/valid', 'a/Accuracy', 'b/valid', 'b/acc']
    assert [len(l.split()) for l in lines[1:]] == [6, 8, 8]  # epoch 0 without b's two cells
    trainer(two_sets(), PrintProgressCB()).fit(2, lr=0.5)  # one line an epoch, after its last pass
    out = [l for l in capsys.readouterr().out.splitlines() if re.match(r'epoch \d+/2 \(', l)]
    assert len(out) == 2 and 'b/valid' not in out[0] and 'b/acc' in out[1] and 'a/Accuracy' in out[0], out

def test_the_names_in_the_csv_and_json_lines_files(tmp_path):
    from aisaac.callbacks.loggers import CSVLogger, JSONLinesLogger
    from aisaac.callbacks.results import ResultsFileCB
    from aisaac.callbacks.monitors import SpeedMonitorCB  # (it logs values per epoch after the training pass, before the validation passes)
    t = trainer(two_sets(), CSVLogger(tmp_path/'log.csv'), JSONLinesLogger(tmp_path/'log.jsonl', per='epoch'), ResultsFileCB(tmp_path/'results.jsonl'),
                SpeedMonitorCB())
    t.fit(3, lr=0.5)
    rows = list(csv.DictReader((tmp_path/'log.csv').open()))
    assert [k for k in rows[0] if '/' in k or 'loss' in k or 'Acc' in k] == [
        'train_loss', 'valid_loss', 'Accuracy', 'a/valid_loss', 'a/Accuracy', 'b/valid_loss', 'b/acc']
    assert [r['epoch'] for r in rows] == ['0', '1', '2'] and rows[0]['b/valid_loss'] == rows[0]['b/acc'] == '' and rows[1]['b/acc'] and rows[2]['b/acc']
    assert float(rows[1]['b/valid_loss']) == t.history.get_metric_values('b/valid_loss')[0]
    lines = [json.loads(l) for l in (tmp_path/'log.jsonl').read_text().splitlines()]
    lines = [l for l in lines if 'valid_loss' in l]  # (the speed monitor's lines aside)
    assert [sorted(k for k in l if '/' in k) for l in lines] == [['a/Accuracy', 'a/valid_loss'], *[['a/Accuracy', 'a/valid_loss', 'b/acc', 'b/valid_loss']] * 2]
    epochs = [json.loads(l) for l in (tmp_path/'results.jsonl').read_text().splitlines() if '"event": "epoch"' in l]
    assert len(epochs) == 3 and 'b/valid_loss' not in epochs[0]['metrics'] and 'b/valid_loss' in epochs[1]['metrics']  # a line an epoch, after its last pass

def test_the_names_reach_tensorboard_and_mlflow(tmp_path, monkeypatch):
    "Through the loggers' `log` event: each set's values under its name ('b/valid_loss' is a chart of the group 'b'), at its epochs"
    pytest.importorskip('mlflow'); pytest.importorskip('tensorboard')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from mlflow.tracking import MlflowClient
    from aisaac.callbacks.trackers import TensorBoardLogger, MLflowLogger
    monkeypatch.chdir(tmp_path)
    ml = MLflowLogger(f'sqlite:///{tmp_path}/mlruns.db', experiment='sets')
    t = trainer(two_sets(), TensorBoardLogger(tmp_path/'tb'), ml)
    t.fit(3, lr=0.5)
    ea = EventAccumulator(str(tmp_path/'tb'), size_guidance={'scalars': 0}); ea.Reload()
    c = MlflowClient(ml.tracking_uri)
    for name in ('a/valid_loss', 'a/Accuracy', 'b/valid_loss', 'b/acc'):
        steps, values = t.history.get_metric_steps(name), t.history.get_metric_values(name)
        assert [e.step for e in ea.Scalars(name)] == steps and [e.value for e in ea.Scalars(name)] == pytest.approx(values, rel=1e-6)
        h = c.get_metric_history(ml.run_id, name)
        assert [m.step for m in h] == steps and [m.value for m in h] == values
    assert t.history.get_metric_steps('b/acc') == [1, 2]

# ---------------------------------------------------------------- watched by savers and stoppers

def test_a_saver_watching_the_second_set_keeps_its_best_weights(tmp_path):
    """SaveBestModelCB(watch_metric='b/valid_loss') reads it at the epochs where b was evaluated (1, 3, 5), keeps the weights of the best
    of those, and puts them back at the end: b's loss of the final weights is its best"""
    from aisaac.callbacks.savers import SaveBestModelCB
    torch.manual_seed(0)
    from aisaac.evals import EvalSetsCB, Eval
    b = batches(1, 3, shift=1.5)  # a set far from the training data: its loss goes up while the training loss goes down
    save = SaveBestModelCB(tmp_path/'best.pt', watch_metric='b/valid_loss')
    t = trainer(EvalSetsCB(a=batches(2, 2), b=Eval(b, every=2)), save)
    t.fit(6, lr=2.)
    values = t.history.get_metric_values('b/valid_loss')
    assert t.history.get_metric_steps('b/valid_loss') == [1, 3, 5] and save.best == min(values) and save.best_epoch == 1 + 2 * values.index(min(values))
    with torch.no_grad():
        x, y = torch.cat([o[0] for o in b]), torch.cat([o[1] for o in b])
        assert abs(nn.CrossEntropyLoss()(t.model(x), y).item() - min(values)) < 1e-5

def test_an_early_stopper_watching_a_set_counts_its_evaluations(capsys):
    from aisaac.callbacks.stoppers import EarlyStoppingCB
    stop = EarlyStoppingCB(watch_metric='b/valid_loss', threshold=10.)  # nothing improves by 10: the 2nd reading stops the fit
    t = trainer(two_sets(), stop)
    t.fit(10, lr=0.5)
    assert t.epoch == 3 and t.history.get_metric_steps('b/valid_loss') == [1, 3]
    assert '(best ' in stop.reason and 'for 1 evaluation ' in stop.reason and stop.reason.endswith('the fit stops after epoch 3')

def test_a_watched_metric_that_no_set_provides_is_refused_when_the_fit_starts():
    """needs/provides: 'c/valid_loss' (no set c), 'b/ac' (b has its own metrics: 'acc') and a set without MetricsCB are refused before
    the first batch; a typo in the name of a metric a set shares with MetricsCB ('a/*'), at the set's first evaluation"""
    from aisaac.callbacks.stoppers import EarlyStoppingCB, ThresholdStopperCB
    from aisaac.callbacks.savers import SaveBestModelCB
    from aisaac.evals import EvalSetsCB
    seen = []
    class First(Callback):
        provides = ()
        def before_batch(self, t): seen.append(t.batch_num)
    for cb in (EarlyStoppingCB(watch_metric='c/valid_loss'), SaveBestModelCB(watch_metric='c/acc'), ThresholdStopperCB('b/ac', 0.5)):
        with pytest.raises(ValueError, match=rf"{type(cb).__name__} needs '{cb.watch_metric}', which none of the callbacks of this fit provides"):
            trainer(two_sets(), First()).fit(2, callbacks=[cb])
    assert seen == []
    with pytest.raises(ValueError, match=r"'a/Acuracy', which was not recorded in trainer.history in epoch 0"):
        trainer(two_sets(), First()).fit(3, callbacks=[ThresholdStopperCB('a/Acuracy', 0.5)])
    assert seen == [0, 1, 2, 3, 4, 5, 0, 1, 0, 1]  # the typo: after a's first evaluation (6 training batches, 2 of dls.valid, 2 of a)
    t = Trainer(types.SimpleNamespace(train=batches(2, 0), valid=batches(1, 1)), nn.CrossEntropyLoss(), torch.optim.SGD, nn.Linear(2, 2),
                callbacks=[BasicTrainCB(), EvalSetsCB(a=batches(1, 2))])
    with pytest.raises(ValueError, match=r"EvalSetsCB needs 'valid_loss'.*Add MetricsCB"): t.fit(1)
    EarlyStoppingCB(watch_metric='a/Accuracy')  # a set that shares MetricsCB's metrics provides each of them
    trainer(two_sets()).fit(1, callbacks=[EarlyStoppingCB(watch_metric='a/Accuracy', greater_is_better=True)])

# ---------------------------------------------------------------- resume, averaged weights, predictions

@pytest.mark.parametrize('steps', [False, True])
def test_a_resumed_run_keeps_each_sets_schedule_and_records(tmp_path, steps):
    """A run that checkpoints every batch, resumed from the middle of epoch 2 (step 8 of a run in steps, mid-interval): its history,
    each set's steps and values, is the uninterrupted run's. Without the set's interval counted from the loaded clock, b came one
    epoch early"""
    from aisaac.callbacks.savers import CheckpointCB
    run = dict(steps=18, valid_every=3) if steps else dict(n_epochs=5)
    every = '6 steps' if steps else 2
    t = trainer(two_sets(every), CheckpointCB(tmp_path, every_n_batches=1, keep_last=None))
    t.fit(**run, lr=0.5)
    ckpt = tmp_path/('checkpoint_step_000008.pt' if steps else 'checkpoint_0002_000002.pt')
    r = trainer(two_sets(every))
    r.fit(**run, lr=0.5, resume_from=ckpt)
    names = t.history.metric_names
    assert r.history.metric_names == names and 'b/acc' in names
    for n in names: assert (r.history.get_metric_steps(n), r.history.get_metric_values(n)) == (t.history.get_metric_steps(n), t.history.get_metric_values(n)), n
    assert t.history.get_metric_steps('b/valid_loss') == ([6, 12, 18] if steps else [1, 3, 4])

def test_with_averaged_weights_every_set_is_evaluated_on_them():
    "EMACB(valid=True): a set that is dls.valid itself gives dls.valid's numbers, on the average; the raw weights come back for training"
    from aisaac.callbacks.averaging import EMACB
    from aisaac.evals import EvalSetsCB
    class Weights(Callback):
        order = 50
        def before_fit(self, t): self.seen = []
        def after_validate(self, t): self.seen.append(t.model.weight.detach().clone())
    w = Weights()
    t = trainer(EMACB(decay=0.9), w, EvalSetsCB(again=batches(2, 1), shifted=batches(2, 2, shift=0.5)))
    t.fit(3, lr=0.5)
    h = t.history
    assert h.get_metric_values('again/valid_loss') == h.get_metric_values('valid_loss') and h.get_metric_values('again/Accuracy') == h.get_metric_values('Accuracy')
    assert all(torch.equal(w.seen[3 * e], w.seen[3 * e + i]) for e in range(3) for i in (1, 2))  # the same weights in each epoch's 3 passes
    assert not torch.equal(w.seen[-1], t.model.weight)  # the raw ones after the fit

def test_captured_predictions_are_dls_valids_only():
    "capture_preds on a trainer with sets: the predictions of dls.valid (before: every set's, one after the other)"
    from aisaac.callbacks.preds import capture_preds
    t = trainer(two_sets())
    preds, targs = capture_preds(t)
    assert len(preds) == len(targs) == 32 and torch.equal(targs, torch.cat([b[1] for b in t.dls.valid]))

def test_set_arguments_are_checked():
    from aisaac.evals import EvalSetsCB, Eval
    with pytest.raises(ValueError, match="without '/'"): EvalSetsCB(**{'a/b': batches(1, 0)})
    with pytest.raises(ValueError, match='got no set'): EvalSetsCB()
    with pytest.raises(TypeError, match='needs a loader of batches'): Eval(3)
    with pytest.raises(TypeError, match='is an iterator'): Eval(b for b in batches(1, 0))
    with pytest.raises(ValueError, match='has no batch'): EvalSetsCB(a=[])
    with pytest.raises(TypeError, match='`metrics` is a dict'): Eval([1], metrics=MulticlassAccuracy())
    with pytest.raises(ValueError, match='names no unit'): Eval([1], every='2 fortnights')
    with pytest.raises(TypeError, match="metric 'b/x'"): trainer(EvalSetsCB(b=Eval(batches(1, 0), metrics={'x': 1.}))).fit(1)

def test_under_accelerate_on_several_processes_a_set_it_did_not_prepare_is_refused(monkeypatch):
    import aisaac.evals
    from aisaac.evals import EvalSetsCB
    class Gathers(Callback): gathers_predictions = True
    monkeypatch.setattr(aisaac.evals, '_world_size', lambda: 2)
    with pytest.raises(TypeError, match="'a' has a loader Accelerate did not prepare"):
        trainer(EvalSetsCB(a=batches(1, 2)), Gathers()).fit(1)

# ---------------------------------------------------------------- 2 processes
TORCHRUN_CASES = HERE/'evals_run.py', {c: [c] for c in ('ddp', 'accel')}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/evals_run.py: those the selected tests use run in one torchrun launch (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)


@torchrun_cases.uses('ddp')
def test_on_two_processes_each_set_records_the_whole_sets_figures(cases):
    """DDP on 2 gloo processes, each process its half of the training data, of dls.valid and of each set (a DistributedSampler): both
    processes record the same figures as one process over the same data, for both sets at their steps; c's interval in samples
    follows the whole run's clock (RanksCB sums the processes' samples: rank 0's batches hold 3 times rank 1's here, 64 samples an
    epoch in all, so c is due every epoch, where rank 0's own 48 would make it due from epoch 1 and rank 1's 16 at epoch 3 only)"""
    import evals_run
    r0, r1 = cases('ddp')
    ref = evals_run.run(1)
    assert r0['history'] == r1['history'], (r0['history'], r1['history'])
    assert sorted(r0['history']) == sorted(ref) and ref['b/valid_loss']['steps'] == [1, 3]
    for n, s in ref.items():
        assert r0['history'][n]['steps'] == s['steps'], n
        assert torch.allclose(torch.tensor(r0['history'][n]['values']), torch.tensor(s['values']), atol=1e-5, rtol=1e-5), (n, r0['history'][n], s)
    assert r0['c_steps'] == r1['c_steps'] == [0, 1, 2, 3] and r0['c_samples'] == r1['c_samples'] == 256, (r0, r1)

@torchrun_cases.uses('accel')
def test_under_accelerate_on_two_processes_a_prepared_set_is_whole(cases):
    """AccelerateCB on 2 processes gathers the validation predictions; a set whose loader its accelerator prepared is measured the same
    way: a set holding dls.valid's samples records dls.valid's figures, on both processes"""
    pytest.importorskip('accelerate')
    r0, r1 = cases('accel')
    for r in (r0, r1):
        h = r['history']
        assert h['again/valid_loss'] == h['valid_loss'] and h['again/acc'] == h['acc'] and h['again/acc']['steps'] == [0, 1], h
    assert r0['history'] == r1['history']

# ---------------------------------------------------------------- nanoGPT's estimate_loss: fresh random batches at each evaluation
class RandomBatches:
    "`n` batches drawn afresh at each pass from a seeded generator (nanoGPT's `get_batch` in `estimate_loss`): an iterable with a length"
    def __init__(self, n, seed): self.n, self.generator, self.x = n, torch.Generator().manual_seed(seed), torch.randn(64, 2)
    def __len__(self): return self.n
    def __iter__(self):
        for _ in range(self.n):
            i = torch.randint(64, (16,), generator=self.generator)
            yield self.x[i], (self.x[i, 0] > 0).long()

def test_a_set_can_be_a_function_that_returns_fresh_batches_at_each_pass():
    "Eval(fn): fn() is called at each evaluation (a generator of new random batches each time); each pass's loss is over its own batches"
    from aisaac.evals import EvalSetsCB, Eval
    g, drawn = torch.Generator().manual_seed(5), []
    def fresh():
        for _ in range(3):
            x = torch.randn(16, 2, generator=g); drawn.append(x)
            yield x, (x[:, 0] > 0).long()
    t = trainer(EvalSetsCB(est=Eval(fresh, metrics={})))
    t.fit(3, lr=0.5)
    assert len(drawn) == 9 and t.history.get_metric_steps('est/valid_loss') == [0, 1, 2]
    assert len({round(v, 6) for v in t.history.get_metric_values('est/valid_loss')}) == 3

def test_a_function_whose_batches_are_used_up_is_an_error_naming_the_set():
    "fn returning the same generator each time: its second pass would be empty, which is refused (no silent empty evaluation)"
    from aisaac.evals import EvalSetsCB, Eval
    once = iter(batches(2, 2))
    t = trainer(EvalSetsCB(est=Eval(lambda: once)))
    with pytest.raises(ValueError, match=r"The evaluation set 'est' gave no batch in epoch 1.*fresh"): t.fit(3, lr=0.5)

def test_an_iterable_with_a_length_that_draws_afresh_is_a_set_and_resumes_exactly(tmp_path):
    "A set that draws random batches from its own generator (as nanoGPT's estimate_loss): a resumed run draws the straight run's batches (the generator's state is in the checkpoint)"
    from aisaac.evals import EvalSetsCB
    from aisaac.callbacks.savers import CheckpointCB
    t = trainer(EvalSetsCB(est=RandomBatches(3, 7)), CheckpointCB(tmp_path, every_n_batches=1, keep_last=None))
    t.fit(4, lr=0.5)
    r = trainer(EvalSetsCB(est=RandomBatches(3, 7)))
    r.fit(4, lr=0.5, resume_from=tmp_path/'checkpoint_0002_000002.pt')
    assert r.history.get_metric_values('est/valid_loss') == t.history.get_metric_values('est/valid_loss')
    assert len(set(t.history.get_metric_values('est/valid_loss'))) == 4

def test_a_sets_loss_can_be_named_train_loss_style(capsys):
    "A set of the training split: `loss_name='loss'` records its loss as 'train/loss' (nanoGPT logs 'train/loss'), beside the running 'train_loss'"
    from aisaac.evals import EvalSetsCB, Eval
    t = trainer(EvalSetsCB(train=Eval(batches(2, 0), loss_name='loss')))
    t.MetricsCB.show = True
    t.fit(2, lr=0.5)
    assert t.history.metric_names == ['train_loss', 'valid_loss', 'Accuracy', 'train/loss', 'train/Accuracy']
    assert 'train/loss' in capsys.readouterr().out
    assert t.EvalSetsCB.provides[0] == 'train/loss'
    with pytest.raises(ValueError, match="`loss_name`"): Eval([1], loss_name='a/b')
    with pytest.raises(ValueError, match="`loss_name` 'acc' is also the name of one of the set's metrics"):
        Eval([1], loss_name='acc', metrics={'acc': MulticlassAccuracy()})

def test_progress_bars_count_the_batches_of_a_set_without_a_length():
    "ProgressCB's bars over a set whose function returns a generator (no len): a bar without an end, not a disabled callback"
    import warnings
    from aisaac.evals import EvalSetsCB, Eval
    from aisaac.callbacks.progress import ProgressCB
    def fresh(): return ((x := torch.randn(16, 2), (x[:, 0] > 0).long()) for _ in range(2))
    t = trainer(EvalSetsCB(est=Eval(fresh)), ProgressCB(bars=True))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        t.fit(2, lr=0.5)
    assert t.history.get_metric_steps('est/valid_loss') == [0, 1]
