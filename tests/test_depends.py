"""Declared dependencies: `run_after`/`run_before` win over `order`, cycles are refused when callbacks are added, a need that
nothing provides stops the fit before anything runs, undeclared callbacks are trusted, and `trainer.plan()` says why."""
from types import SimpleNamespace
import pytest, torch
from torch import nn
from torcheval.metrics import MulticlassAccuracy
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.savers import SaveBestModelCB, CheckpointCB
from aisaac.callbacks.stoppers import EarlyStoppingCB, ThresholdStopperCB
from aisaac.callbacks.schedule import PlateauSchedulerCB
from aisaac.callbacks.monitors import SpeedMonitorCB, LRMonitorCB
from aisaac.callbacks.gradients import GradClipCB
from aisaac.callbacks.precision import MixedPrecisionCB


def dls(n=64, bs=16):
    torch.manual_seed(0)
    x = torch.randn(n, 2)
    batches = [(x[i:i+bs], x[i:i+bs].sum(1, keepdim=True)) for i in range(0, n, bs)]
    return SimpleNamespace(train=batches, valid=batches[:1])

def trainer(*cbs, basic=True):
    torch.manual_seed(0)
    return Trainer(dls(), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[BasicTrainCB()] * basic + list(cbs))

class Note(Callback):
    "Appends its name to a shared list at `before_epoch`"
    def __init__(self, name, log, order=0, **attrs):
        self.name, self.log, self.order = name, log, order
        for k, v in attrs.items(): setattr(self, k, v)
    def before_epoch(self, t): self.log.append(self.name)


def test_run_after_and_run_before_win_over_order():
    log = []
    t = trainer(Note('late', log, order=50), Note('early', log, order=-50, run_after='Note2'))
    class Note2(Note): pass
    t.add_callbacks(Note2('n2', log, order=100, run_before=[Note]))  # before every Note: a class, and parents count
    t.fit(1, valid=False)
    assert log == ['n2', 'early', 'late']  # n2 (order 100) first by its relation; the others keep their numbers' order

def test_relations_keep_the_usual_order_where_they_can():
    log = []
    a, b, c = Note('a', log, order=1), Note('b', log, order=2), Note('c', log, order=3, run_before='Marker')
    class Marker(Note): pass
    m = Marker('m', log, order=0)
    trainer(a, b, c, m).fit(1, valid=False)
    assert log == ['a', 'b', 'c', 'm']  # only `m` moves (after `c`); `a` and `b` keep their numbers' order

def test_a_cycle_is_refused_when_added_and_nothing_is_left_behind():
    log = []
    class P(Note): run_after = 'Q'
    class Q(Note): run_after = 'P'
    t = trainer()
    before = list(t.cbs)
    with pytest.raises(ValueError, match=r"cycle: (P -> Q -> P|Q -> P -> Q) \((Q.run_after P; P.run_after Q|P.run_after Q; Q.run_after P)\)"):
        t.add_callbacks([P('p', log), Q('q', log)])
    assert t.cbs == before and not hasattr(t, 'P') and not hasattr(t, 'Q')

def test_a_bad_relation_is_a_clear_error():
    with pytest.raises(TypeError, match=r"run_after holds 3: give callback classes or class names"):
        trainer(Note('x', [], run_after=(3,)))

def test_a_need_nobody_provides_stops_the_fit_before_any_callback_runs(tmp_path):
    log = []
    t = trainer(SaveBestModelCB(tmp_path/'best.pt'), Note('n', log))
    t.cbs[-1].provides = ()  # everything declares: the need is surely unmet
    with pytest.raises(ValueError, match=r"SaveBestModelCB needs 'valid_loss', which none of the callbacks of this fit provides \(.*\)\. Add MetricsCB"):
        t.fit(2)
    assert log == [] and t.clock.step == 0 and not (tmp_path/'best.pt').exists()

@pytest.mark.parametrize('cb', [lambda p: EarlyStoppingCB(watch_metric='valid_acc'), lambda p: ThresholdStopperCB('valid_acc', 0.5, greater_is_better=True),
                                lambda p: PlateauSchedulerCB('valid_acc'), lambda p: SaveBestModelCB(p/'b.pt', 'valid_acc')])
def test_every_metric_watcher_needs_its_metric(tmp_path, cb):
    with pytest.raises(ValueError, match=r"needs 'valid_acc'"): trainer(MetricsCB(show=False), cb(tmp_path)).fit(1)

def test_metrics_cb_provides_its_metrics_by_name(tmp_path):
    t = trainer(MetricsCB(valid_acc=MulticlassAccuracy(), show=False), SaveBestModelCB(tmp_path/'b.pt', 'valid_acc', greater_is_better=True))
    t.check_needs()
    assert 'valid_acc' in t.MetricsCB.provides and t.MetricsCB.needs == ('loss', 'preds')

def test_an_undeclared_callback_of_yours_is_trusted(tmp_path):
    "A user's callback that records the metric itself, without declaring it, keeps working as before the contracts existed"
    class Record(Callback):
        order = -1  # before the saver reads it
        def checkpoint(self, t, at):
            if at == 'epoch': t.history.update_metric('valid_loss', 1.0 / (t.epoch + 1))
    t = trainer(SaveBestModelCB(tmp_path/'best.pt'), Record())
    t.fit(2)
    assert t.SaveBestModelCB.best == 0.5 and (tmp_path/'best.pt').exists()
    assert [r for r in t.plan().needs] == [('SaveBestModelCB', 'valid_loss', 'unverified: a callback without `provides` may')]

def test_a_declared_provider_of_yours_meets_the_need(tmp_path):
    class Record(Callback):
        order, provides = -1, ('my_*',)
        def checkpoint(self, t, at):
            if at == 'epoch': t.history.update_metric('my_score', float(t.epoch))
    t = trainer(EarlyStoppingCB(watch_metric='my_score', greater_is_better=True), Record())
    t.fit(3)
    assert [r for r in t.plan().needs] == [('EarlyStoppingCB', 'my_score', 'Record')]

def test_monitors_provide_what_they_record():
    t = trainer(SpeedMonitorCB(), LRMonitorCB(), PlateauSchedulerCB('epoch_samples_per_sec'), ThresholdStopperCB('momentum', 0.5))
    t.check_needs()
    assert dict((r[1], r[2]) for r in t.plan().needs) == {'epoch_samples_per_sec': 'SpeedMonitorCB', 'momentum': 'LRMonitorCB'}

def test_a_trainer_subclass_with_its_own_steps_provides_preds_and_loss():
    class Mine(Trainer):
        def predict(self): self.preds = self.model(self.batch[0])
        def get_loss(self): self.loss = self.loss_func(self.preds, self.batch[1])
        def backward(self): self.loss.backward()
        def step(self): self.opt.step()
        def zero_grad(self): self.opt.zero_grad()
    t = Mine(dls(), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[MetricsCB(show=False)])
    t.fit(1)  # no false alarm: the trainer's own steps provide what MetricsCB needs
    assert 'valid_loss' in t.history.metric_names
    assert list(t.plan().needs) == [('MetricsCB', 'loss', 'Mine')]

def test_metrics_without_a_training_step_is_refused_before_the_fit():
    with pytest.raises(ValueError, match=r"MetricsCB needs 'loss'.*Add BasicTrainCB"):
        trainer(MetricsCB(show=False), basic=False).check_needs()

def test_per_fit_callbacks_take_part(tmp_path):
    t = trainer(SaveBestModelCB(tmp_path/'best.pt'))
    t.fit(1, callbacks=[MetricsCB(show=False)])  # provided by a callback of this fit only
    with pytest.raises(ValueError, match="SaveBestModelCB needs 'valid_loss'"): t.fit(1)

def test_the_builtins_declared_order_holds_against_order_numbers(tmp_path):
    es, clip = EarlyStoppingCB(), GradClipCB(1.0)
    es.order, clip.order = 500, -100  # a user moves them by number
    t = trainer(MetricsCB(show=False), es, CheckpointCB(tmp_path), SaveBestModelCB(tmp_path/'b.pt'), clip, MixedPrecisionCB())
    p = t.plan()
    assert [r[2] for r in p if r[0] == 'checkpoint'] == ['SaveBestModelCB', 'EarlyStoppingCB', 'CheckpointCB']
    assert [r[2] for r in p if r[0] == 'before_step'] == ['MixedPrecisionCB', 'GradClipCB']
    assert [r[4] for r in p if r[0] == 'before_step'][1] == 'GradClipCB.run_after MixedPrecisionCB'

def test_plan_says_why(tmp_path):
    log = []
    t = trainer(Note('a', log, order=5), Note('b', log, order=5), Note('c', log, order=1, run_after='Late'))
    class Late(Note): pass
    t.add_callbacks(Late('late', log, order=9))
    rows = [(r[2], r[3], r[4]) for r in t.plan() if r[0] == 'before_epoch' and r[2] != 'BasicTrainCB']
    assert [r[0] for r in rows] == ['Note', 'Note_1', 'Late', 'Note_2']
    assert rows[1:] == [('Note_1', 5, 'same order: added later'), ('Late', 9, 'order 5 < 9'), ('Note_2', 1, 'Note.run_after Late')]
    assert 'why here' in repr(t.plan()) and '| event |' in t.plan()._repr_markdown_()

def test_the_needs_of_a_plan_print_as_their_own_table_and_say_when_there_are_none():
    "`trainer.plan().needs` printed (it raised IndexError: a summary of four columns over rows of three) and empty"
    b = [(torch.randn(4, 2), torch.randn(4, 1))]
    t = Trainer(SimpleNamespace(train=b, valid=b), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[BasicTrainCB(), MetricsCB()])
    needs = t.plan().needs
    lines = repr(needs).splitlines()
    assert lines[0].split() == ['callback', 'needs', 'provided', 'by'] and any('MetricsCB' in l and 'loss' in l for l in lines[1:])
    assert needs._repr_markdown_().startswith('| callback | needs | provided by |')
    t.remove_callbacks(t.MetricsCB)
    assert repr(t.plan().needs) == '(no callback declares a need)' and 'provided by' not in repr(t.plan())

def test_show_training_loop_prints_the_loop_with_the_callbacks_at_each_event(capsys):
    b = [(torch.randn(4, 2), torch.randn(4, 1))]
    t = Trainer(SimpleNamespace(train=b, valid=b), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[BasicTrainCB(), MetricsCB()])
    t.show_training_loop()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'fit:' and any(l.strip().startswith('for each batch:') for l in out)
    rows = {l.split()[0]: l.split()[1:] for l in out if l.startswith(' ') and len(l.split()) >= 2 and not l.rstrip().endswith(':')}
    assert rows['predict'] == ['BasicTrainCB'] and rows['step'] == ['BasicTrainCB']
    assert 'MetricsCB' in ' '.join(rows['after_batch']) and rows['before_zero_grad'] == ['-']
    assert sum(l.split()[0] == 'predict' for l in out if l.startswith(' ')) == 2  # in the training and the validation pass
