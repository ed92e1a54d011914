"""Tests of the core loop: phases and cancellation, per-fit callbacks, ordering, groups, naming,
custom events, bad-input errors, and the basic training callbacks."""
import copy, types
import pytest
import torch
from torch import nn

from aisaac.all import (Callback, CancelBatchException, CancelEpochException, CancelFitException,
                         Trainer, view_source_code)
from aisaac.callbacks.train import BasicTrainCB, MomentumTrainCB, DeviceCB, OneBatchCB
from aisaac.callbacks.metrics import MetricsCB
from tiny import make_dls, make_trainer


# ---------------------------------------------------------------- helpers

EVENTS = ('before_fit', 'before_epoch', 'before_batch', 'predict', 'get_loss', 'before_backward', 'backward',
          'step', 'zero_grad', 'after_batch', 'cleanup_batch', 'after_epoch', 'cleanup_epoch', 'after_fit', 'cleanup_fit')

def _recorder(event):
    def f(self, trainer): self.log.append((event, trainer.epoch, trainer.training, getattr(trainer, 'batch_num', None)))
    f.__name__ = event
    return f

class Rec(Callback):
    "Records (event, epoch, training, batch_num) for every core event"
    order = 5  # after BasicTrainCB's steps within an event
    def __init__(self): self.log = []
    def events(self): return [e[0] for e in self.log]
for _e in EVENTS: setattr(Rec, _e, _recorder(_e))

class Raiser(Callback):
    "Raises `exc` in `event` when `when(trainer)` holds"
    order = 1
    def __init__(self, event, exc, when=lambda t: True):
        self.exc, self.when, self.n = exc, when, 0
        setattr(self, event, self._raise)
    def _raise(self, trainer):
        if self.when(trainer):
            self.n += 1
            raise self.exc if isinstance(self.exc, BaseException) else self.exc()


# ---------------------------------------------------------------- batch cancellation

def test_cancel_batch_in_before_batch_skips_steps_and_after_batch_but_runs_cleanup():
    rec = Rec()
    trainer = make_trainer([Raiser('before_batch', CancelBatchException, lambda t: t.training and t.batch_num == 0), rec])
    trainer.fit(1)
    first = [e for e, ep, tr, b in rec.log if tr and b == 0 and e not in ('before_fit', 'before_epoch', 'after_epoch', 'cleanup_epoch')]
    # Rec (order 5) runs after the raiser (order 1), so even its before_batch is skipped
    assert first == ['cleanup_batch']
    second = [e for e, ep, tr, b in rec.log if tr and b == 1 and e not in ('after_epoch', 'cleanup_epoch')]
    assert second == ['before_batch', 'predict', 'get_loss', 'before_backward', 'backward', 'step', 'zero_grad',
                      'after_batch', 'cleanup_batch']
    # the epoch itself was not cancelled
    assert rec.events().count('after_epoch') == 2 and rec.events().count('after_fit') == 1

def test_cancel_batch_leaves_the_model_untouched():
    trainer = make_trainer([Raiser('before_batch', CancelBatchException)])
    before = copy.deepcopy(trainer.model.state_dict())
    trainer.fit(2, lr=0.5)
    for k, v in trainer.model.state_dict().items(): assert torch.equal(v, before[k])


# ---------------------------------------------------------------- epoch cancellation

def test_cancel_epoch_in_before_epoch_skips_after_epoch_runs_cleanup_and_continues():
    rec = Rec()
    trainer = make_trainer([Raiser('before_epoch', CancelEpochException, lambda t: t.training and t.epoch == 0), rec])
    trainer.fit(2)
    ep0_train = [e for e, ep, tr, b in rec.log if ep == 0 and tr and e != 'before_fit']
    assert ep0_train == ['cleanup_epoch']
    # the validation pass of the same epoch and the next epoch still run completely
    ep0_valid = [e for e, ep, tr, b in rec.log if ep == 0 and not tr]
    assert ep0_valid[0] == 'before_epoch' and ep0_valid[-2:] == ['after_epoch', 'cleanup_epoch']
    assert 'predict' in ep0_valid
    ep1_train = [e for e, ep, tr, b in rec.log if ep == 1 and tr]
    assert ep1_train.count('step') == 2 and ep1_train[-2:] == ['after_epoch', 'cleanup_epoch']
    assert rec.events()[-2:] == ['after_fit', 'cleanup_fit']

def test_cancel_epoch_mid_epoch_stops_the_pass_and_the_next_pass_continues():
    rec = Rec()
    trainer = make_trainer([Raiser('after_batch', CancelEpochException, lambda t: t.training and t.epoch == 0), rec])
    trainer.fit(2)
    ep0_train = [(e, b) for e, ep, tr, b in rec.log if ep == 0 and tr and e != 'before_fit']
    events0 = [e for e, _ in ep0_train]
    assert 'after_epoch' not in events0 and events0[-2:] == ['cleanup_batch', 'cleanup_epoch']
    assert {b for e, b in ep0_train if e == 'predict'} == {0}  # the second batch never ran
    assert [e for e, ep, tr, b in rec.log if ep == 0 and not tr].count('after_epoch') == 1
    ep1_train = [e for e, ep, tr, b in rec.log if ep == 1 and tr]
    assert ep1_train.count('predict') == 2 and 'after_epoch' in ep1_train

def test_cancel_epoch_in_before_epoch_with_metrics():
    "A user cancels the first training pass before MetricsCB's before_epoch ran; MetricsCB's cleanup_epoch must cope"
    canceller = Raiser('before_epoch', CancelEpochException, lambda t: t.training and t.epoch == 0)
    canceller.order = -1
    trainer = make_trainer([canceller, MetricsCB()])
    trainer.fit(1)
    assert len(trainer.MetricsCB.losses_epoch) == 1 and 'valid' in trainer.MetricsCB.losses_epoch[0]


# ---------------------------------------------------------------- fit cancellation

def test_cancel_fit_skips_after_fit_runs_cleanup_fit_and_fit_returns():
    rec = Rec()
    trainer = make_trainer([Raiser('before_epoch', CancelFitException, lambda t: t.epoch == 1), rec])
    assert trainer.fit(3) is None  # returns normally
    ev = rec.events()
    assert 'after_fit' not in ev and ev[-1] == 'cleanup_fit'
    assert {ep for e, ep, tr, b in rec.log if e == 'predict'} == {0}
    assert ev.count('cleanup_epoch') == 3  # train and valid of epoch 0, the cancelled pass of epoch 1
    assert ev.count('after_epoch') == 2


# ---------------------------------------------------------------- ordinary exceptions

class Boom(Exception): pass

def test_ordinary_exception_propagates_after_all_cleanups_in_order():
    rec = Rec()
    err = Boom('in step')
    trainer = make_trainer([Raiser('step', err, lambda t: t.batch_num == 1), rec])
    with pytest.raises(Boom) as info: trainer.fit(2)
    assert info.value is err
    ev = rec.events()
    tail = ev[ev.index('backward', len(ev) - 6):]
    assert tail == ['backward', 'cleanup_batch', 'cleanup_epoch', 'cleanup_fit']
    assert ev.count('after_epoch') == 0 and 'after_fit' not in ev
    assert ev.count('after_batch') == 1  # only batch 0 completed

def test_per_fit_callbacks_are_removed_after_an_exception_and_trainer_callbacks_stay():
    own = Rec()
    trainer = make_trainer([own])
    per_fit = Rec()
    class Group:
        def __init__(self): self.callbacks = [MetricsCB(), Raiser('get_loss', Boom)]
    group = Group()
    with pytest.raises(Boom): trainer.fit(1, callbacks=[per_fit, group])
    assert per_fit.log, 'the per-fit callback ran'
    assert not hasattr(trainer, 'Rec_1') and not hasattr(trainer, 'Group')
    assert not hasattr(trainer, 'MetricsCB') and not hasattr(trainer, 'Raiser')
    assert trainer.cbs == [trainer.BasicTrainCB, own]
    assert trainer.Rec is own
    # and the trainer still fits without the removed callbacks
    n = len(per_fit.log)
    trainer.fit(1)
    assert len(per_fit.log) == n and 'after_fit' in own.events()

def test_per_fit_callbacks_are_removed_after_a_normal_fit():
    trainer = make_trainer()
    m = MetricsCB()
    trainer.fit(1, callbacks=m)
    assert len(m.losses_epoch) == 1
    assert not hasattr(trainer, 'MetricsCB') and m not in trainer.cbs
    trainer.fit(1, callbacks=m)  # can be passed again: it was really removed
    assert len(m.losses_epoch) == 2


# ---------------------------------------------------------------- bad input

def test_callback_class_instead_of_instance_in_trainer():
    with pytest.raises(TypeError, match='pass an instance'):
        Trainer(make_dls(), nn.MSELoss(), model=nn.Linear(2, 1), callbacks=[BasicTrainCB])

def test_callback_class_instead_of_instance_in_fit():
    trainer = make_trainer()
    with pytest.raises(TypeError, match='pass an instance'): trainer.fit(1, callbacks=[MetricsCB])
    assert not hasattr(trainer, 'MetricsCB')

def test_bad_fit_callback_list_leaves_no_callback_behind():
    trainer = make_trainer()
    good = Rec()
    with pytest.raises(TypeError, match='pass an instance'): trainer.fit(1, callbacks=[good, MetricsCB])
    assert not hasattr(trainer, 'Rec')
    trainer.fit(1)
    assert good.log == []

def test_non_callable_loss():
    with pytest.raises(TypeError, match='`loss_func` must be callable'):
        Trainer(make_dls(), 'mse', model=nn.Linear(2, 1))

def test_optimizer_instance_instead_of_class():
    model = nn.Linear(2, 1)
    with pytest.raises(TypeError, match='pass the class'):
        Trainer(make_dls(), nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), model=model)

def test_dls_without_train_and_valid():
    with pytest.raises(TypeError, match='train.*valid'):
        Trainer([(torch.zeros(1, 2), torch.zeros(1, 1))], nn.MSELoss(), model=nn.Linear(2, 1))
    with pytest.raises(TypeError, match='DataLoaders'):
        Trainer(types.SimpleNamespace(train=[]), nn.MSELoss(), model=nn.Linear(2, 1))


# ---------------------------------------------------------------- ordering, groups, names

class Tag(Callback):
    def __init__(self, name, order=0, out=None, core=False):
        self.name, self.order, self.out, self.core = name, order, out, core
    def before_fit(self, trainer): self.out.append(self.name)

def test_callbacks_run_by_order_with_ties_in_insertion_order():
    out = []
    cbs = [Tag('b', 1, out), Tag('a1', 0, out), Tag('c', 2, out), Tag('a2', 0, out), Tag('m', -1, out), Tag('a3', 0, out)]
    trainer = make_trainer(cbs)
    trainer.fit(1, callbacks=[Tag('fit0', 0, out), Tag('fit2', 2, out)])
    assert out == ['m', 'a1', 'a2', 'a3', 'fit0', 'b', 'c', 'fit2']

def test_core_callbacks_run_first_among_equal_order():
    out = []
    class LoggingDevice(DeviceCB):
        def before_fit(self, trainer): out.append('device'); super().before_fit(trainer)
    trainer = make_trainer([Tag('user', 0, out), Tag('early', -1, out), Tag('core_like', 0, out, core=True)])
    trainer.add_callbacks(LoggingDevice('cpu'))  # added last, still first among order 0
    trainer.fit(1)
    assert out == ['early', 'core_like', 'device', 'user']
    assert [getattr(cb, 'name', type(cb).__name__) for cb in trainer.cbs] == \
        ['early', 'BasicTrainCB', 'core_like', 'LoggingDevice', 'user']

def test_recursive_groups_add_and_remove_all_members():
    out = []
    class Group(Callback):
        def __init__(self, name, callbacks): self.callbacks, self.name = callbacks, name
        def before_fit(self, trainer): out.append(self.name)
    inner = Group('inner', [Tag('x', 0, out), Tag('y', 0, out)])
    outer = Group('outer', [Tag('w', 0, out), inner])
    trainer = make_trainer()
    trainer.fit(1, callbacks=outer)
    assert out == ['outer', 'w', 'inner', 'x', 'y']  # the groups' own hooks run too
    assert trainer.cbs == [trainer.BasicTrainCB]
    assert not any(hasattr(trainer, n) for n in ('Group', 'Group_1', 'Tag', 'Tag_1', 'Tag_2'))
    # the same with add/remove on the trainer
    trainer.add_callbacks(outer)
    assert trainer.Group is outer and trainer.Group_1 is inner and trainer.Tag_2.name == 'y'
    assert len(trainer.cbs) == 6
    trainer.remove_callbacks(outer)
    assert trainer.cbs == [trainer.BasicTrainCB] and not hasattr(trainer, 'Tag')

def test_two_instances_of_one_class_get_distinct_names_and_both_run():
    out = []
    a, b = Tag('a', 0, out), Tag('b', 0, out)
    trainer = make_trainer([a, b])
    assert trainer.Tag is a and trainer.Tag_1 is b
    trainer.fit(1)
    assert out == ['a', 'b']


# ---------------------------------------------------------------- train/valid passes

def test_fit_without_valid_trains_only():
    rec = Rec()
    trainer = make_trainer([rec])
    trainer.fit(2, valid=False)
    assert {tr for e, ep, tr, b in rec.log if e == 'predict'} == {True}
    assert rec.events().count('step') == 4 and rec.events().count('before_epoch') == 2

def test_fit_without_train_validates_only_and_does_not_change_weights():
    rec = Rec()
    trainer = make_trainer([rec])
    before = copy.deepcopy(trainer.model.state_dict())
    trainer.fit(2, lr=1., train=False)
    assert {tr for e, ep, tr, b in rec.log if e == 'predict'} == {False}
    assert rec.events().count('predict') == 2 and 'step' not in rec.events() and 'backward' not in rec.events()
    for k, v in trainer.model.state_dict().items(): assert torch.equal(v, before[k])

def test_validation_is_not_training_and_computes_no_gradients():
    seen, grads = [], []
    class Spy(Callback):
        order = 1
        def predict(self, trainer):
            seen.append((trainer.training, torch.is_grad_enabled(), trainer.preds.requires_grad))
        def backward(self, trainer): grads.append(trainer.model.weight.grad is not None)
    trainer = make_trainer([Spy()])
    trainer.fit(1)
    assert seen == [(True, True, True)] * 2 + [(False, False, False)]
    assert grads == [True, True]  # training did compute gradients


# ---------------------------------------------------------------- custom events, summary, source

def test_custom_events_pass_named_kwargs_and_all_to_var_kwargs():
    got = {}
    class Named(Callback):
        def verify_batch(self, trainer, xb): got['named'] = (trainer, xb)
    class Both(Callback):
        def verify_batch(self, trainer, yb, xb): got['both'] = (xb, yb)
    class Any(Callback):
        def verify_batch(self, trainer, **kwargs): got['any'] = kwargs
    class NoArgs(Callback):
        def verify_batch(self, trainer): got['none'] = trainer
    trainer = make_trainer([Named(), Both(), Any(), NoArgs()])
    xb, yb = torch.ones(2), torch.zeros(2)
    trainer.run_callbacks('verify_batch', xb=xb, yb=yb)
    assert got['named'][0] is trainer and got['named'][1] is xb
    assert got['both'][0] is xb and got['both'][1] is yb
    assert got['any'].keys() == {'xb', 'yb'} and got['any']['yb'] is yb
    assert got['none'] is trainer

def test_summarize_callbacks_lists_events_in_loop_order_with_names():
    class Watch(Callback):
        "Watches the loop"
        order = 3
        custom_events = ('after_custom',)
        def after_batch(self, trainer): "Look at the batch"
        def before_fit(self, trainer): pass
        def cleanup_fit(self, trainer): pass
        def after_custom(self, trainer): pass
    trainer = make_trainer([Watch(), Watch()])
    rows = list(trainer.summarize_callbacks())
    events = [r[0] for r in rows]
    assert events == ['before_fit', 'before_fit', 'predict', 'get_loss', 'backward', 'step', 'zero_grad',
                      'after_batch', 'after_batch', 'cleanup_fit', 'cleanup_fit', 'after_custom', 'after_custom']
    assert ('after_batch', 'Watch', 3, 'Look at the batch') in rows
    assert ('after_batch', 'Watch_1', 3, 'Look at the batch') in rows
    assert rows[2][1] == 'BasicTrainCB' and 'opt.step()' in rows[5][3]
    assert 'Watch_1' in repr(trainer.summarize_callbacks())

def test_view_source_code_prints_in_a_terminal(capsys):
    view_source_code(BasicTrainCB)
    out = capsys.readouterr().out
    assert out.startswith('class BasicTrainCB(Callback):')
    assert 'trainer.opt.step()' in out and 'trainer.loss.backward()' in out


# ---------------------------------------------------------------- training callbacks

def test_two_metrics_callbacks_keep_separate_state():
    from torcheval.metrics import Mean
    class MeanPred(Mean):
        def update(self, preds, targets): return super().update(preds.flatten())
    trainer = make_trainer([MetricsCB(), MetricsCB(m=MeanPred())])
    a, b = trainer.MetricsCB, trainer.MetricsCB_1
    trainer.fit(2)
    assert len(a.losses_epoch) == 2 and len(b.losses_epoch) == 2
    assert a.losses_epoch is not b.losses_epoch and a.metrics_epoch is not b.metrics_epoch
    assert a.losses_epoch == b.losses_epoch  # same losses, computed independently
    assert a.metrics_epoch == [{}, {}] and [list(r) for r in b.metrics_epoch] == [['m'], ['m']]
    assert len(a.losses_batch) == len(b.losses_batch) == 2 * 3

def test_metrics_loss_is_weighted_by_batch_size():
    dls = make_dls(n_train=(5, 1), n_valid=(4, 1, 1))
    trainer = make_trainer([MetricsCB()], dls=dls)
    m = trainer.MetricsCB
    trainer.fit(1, lr=0.)  # lr 0: the weights stay, so every batch sees the same model
    with torch.no_grad():
        def full(batches):
            x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
            return nn.MSELoss()(trainer.model(x), y).item()
        def unweighted(batches): return sum(nn.MSELoss()(trainer.model(x), y).item() for x, y in batches) / len(batches)
        assert abs(full(dls.valid) - unweighted(dls.valid)) > 1e-3  # the test can tell them apart
        assert m.losses_epoch[0]['valid'] == pytest.approx(full(dls.valid), rel=1e-5)
        assert m.losses_epoch[0]['train'] == pytest.approx(full(dls.train), rel=1e-5)

def test_one_batch_cb_runs_exactly_one_optimizer_step():
    steps = []
    class CountSteps(Callback):
        order = 1
        def step(self, trainer): steps.append((trainer.epoch, trainer.batch_num))
    rec = Rec()
    trainer = make_trainer([OneBatchCB(), CountSteps(), rec])
    before = trainer.model.weight.detach().clone()
    trainer.fit(3, lr=0.1)
    assert steps == [(0, 0)]
    assert not torch.equal(before, trainer.model.weight)
    assert 'after_fit' not in rec.events() and rec.events()[-1] == 'cleanup_fit'

def test_momentum_train_cb_keeps_momentum_times_grad():
    dls = make_dls(n_train=(4,), n_valid=(2,))
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    ref = copy.deepcopy(model)
    nn.MSELoss()(ref(dls.train[0][0]), dls.train[0][1]).backward()
    trainer = Trainer(dls, nn.MSELoss(), torch.optim.SGD, model=model, callbacks=[MomentumTrainCB(momentum=0.5)])
    trainer.fit(1, lr=0.1, valid=False)
    for p, r in zip(model.parameters(), ref.parameters()):
        assert r.grad.abs().sum() > 0
        assert torch.allclose(p.grad, 0.5 * r.grad)
        assert torch.allclose(p.detach(), r.detach() - 0.1 * r.grad)  # the step used the full gradient
