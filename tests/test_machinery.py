"""Tests of the callback machinery: hook-name checking, error notes, `outcome` in cleanup, `around_` contexts,
`on_error` policies, groups and callback state, and `trace`."""
import functools, warnings
import tiny
import pytest
import torch

from aisaac.all import Callback, CancelBatchException, CancelFitException, Trainer, with_cbs
from aisaac.callbacks.train import OneBatchCB
from aisaac.callbacks.metrics import MetricsCB


# ---------------------------------------------------------------- helpers

make_dls = functools.partial(tiny.make_dls, n_train=(3, 3, 2))  # three training batches here
make_trainer = functools.partial(tiny.make_trainer, n_train=(3, 3, 2))

def autocast_cpu_enabled():
    try: return torch.is_autocast_enabled('cpu')
    except TypeError: return torch.is_autocast_cpu_enabled()


# ---------------------------------------------------------------- 1. misspelled hooks

@pytest.mark.parametrize('name, expected', [('befor_batch', 'before_batch'), ('after_predcit', 'after_predict'),
                                            ('zero_grads', 'zero_grad')])
@pytest.mark.parametrize('where', ['trainer', 'fit'])
def test_misspelled_hook_raises(name, expected, where):
    cb = type('Typo', (Callback,), {name: lambda self, trainer: None})()
    if where == 'trainer':
        with pytest.raises(AttributeError, match=repr(expected)): make_trainer([cb])
    else:
        trainer = make_trainer()
        before = list(trainer.cbs)
        with pytest.raises(AttributeError, match=repr(expected)): trainer.fit(1, callbacks=[cb])
        assert trainer.cbs == before and not hasattr(trainer, 'Typo')

def test_unknown_event_prefix_raises():
    class Whatever(Callback):
        def after_whatever(self, trainer): pass
    with pytest.raises(AttributeError, match='after_whatever'): make_trainer([Whatever()])

def test_custom_events_accepted():
    class Whatever(Callback):
        custom_events = ('after_whatever',)
        def __init__(self): self.n = 0
        def after_whatever(self, trainer): self.n += 1
    cb = Whatever()
    trainer = make_trainer([cb])
    trainer.run_callbacks('after_whatever')
    assert cb.n == 1

def test_helper_methods_accepted():
    class Helpers(Callback):
        def plot_stats(self): pass
        def color_dim(self): pass
        def lr_find(self): pass
    trainer = make_trainer([Helpers()])
    trainer.fit(1)
    assert hasattr(trainer, 'Helpers')

def test_subclass_phase_makes_its_events_known():
    class ExtraTrainer(Trainer):
        @with_cbs('extra')
        def extra(self): self.did_extra = True
    class Extra(Callback):
        def __init__(self): self.seen = []
        def before_extra(self, trainer): self.seen.append('before')
        def after_extra(self, trainer): self.seen.append('after')
    cb = Extra()
    trainer = make_trainer([cb], cls=ExtraTrainer)
    trainer.extra()
    assert cb.seen == ['before', 'after'] and trainer.did_extra
    # the plain Trainer has no `extra` phase, so the same callback is refused there
    with pytest.raises(AttributeError): make_trainer([Extra()])


# ---------------------------------------------------------------- 2. error notes

def test_exception_gains_note_naming_callback_event_order_epoch_batch():
    class Boom(Callback):
        order = 3
        def after_loss(self, trainer):
            if trainer.batch_num == 1: raise ValueError('boom')
    trainer = make_trainer([Boom()])
    with pytest.raises(ValueError, match='boom') as info: trainer.fit(2)
    e = info.value
    assert type(e) is ValueError
    note = ' '.join(e.__notes__)
    for part in ('Boom', 'after_loss', 'order', '3', 'epoch 0', 'batch 1'): assert part in note, (part, note)

def test_cancel_exception_passes_untouched():
    class Skip(Callback):
        def __init__(self): self.n = 0
        def before_predict(self, trainer):
            self.n += 1
            raise CancelBatchException()
    cb = Skip()
    trainer = make_trainer([cb])
    with pytest.raises(CancelBatchException) as info: trainer.run_callbacks('before_predict')
    assert not getattr(info.value, '__notes__', None)
    # in a fit it just skips each batch: the fit completes and the weights stay put
    w0 = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.fit(1)
    assert cb.n == 1 + 3 + 1
    assert all(torch.equal(w0[k], v) for k, v in trainer.model.state_dict().items())


# ---------------------------------------------------------------- 3. outcome in cleanup_fit

class Outcome(Callback):
    def __init__(self): self.seen = []
    def cleanup_fit(self, trainer): self.seen.append((trainer.outcome, getattr(trainer, 'exception', None)))

def _raiser(exc):
    class Raiser(Callback):
        def after_batch(self, trainer): raise exc
    return Raiser()

def test_outcome_ok():
    cb = Outcome()
    make_trainer([cb]).fit(1)
    assert [o for o, _ in cb.seen] == ['ok']

def test_outcome_cancelled():
    cb = Outcome()
    make_trainer([cb, _raiser(CancelFitException())]).fit(2)
    assert [o for o, _ in cb.seen] == ['cancelled']

def test_outcome_error():
    cb, err = Outcome(), ValueError('bad')
    trainer = make_trainer([cb, _raiser(err)])
    with pytest.raises(ValueError): trainer.fit(1)
    assert cb.seen == [('error', err)]
    assert trainer.exception is err

def test_outcome_interrupted():
    cb = Outcome()
    trainer = make_trainer([cb, _raiser(KeyboardInterrupt())])
    with pytest.raises(KeyboardInterrupt): trainer.fit(1)
    assert [o for o, _ in cb.seen] == ['interrupted']


# ---------------------------------------------------------------- 4. around_ contexts

def test_around_batch_autocast_exits_on_error():
    class Autocast(Callback):
        def around_batch(self, trainer):
            with torch.autocast('cpu', dtype=torch.bfloat16): yield
    class Probe(Callback):
        order = 1
        def __init__(self): self.seen = []
        def predict(self, trainer): self.seen.append((autocast_cpu_enabled(), trainer.preds.dtype))
    class Fail(Callback):
        order = 1
        def get_loss(self, trainer): raise RuntimeError('loss failed')
    probe = Probe()
    trainer = make_trainer([Autocast(), probe, Fail()])
    assert not autocast_cpu_enabled()
    with pytest.raises(RuntimeError, match='loss failed'): trainer.fit(1)
    assert probe.seen == [(True, torch.bfloat16)]
    assert not autocast_cpu_enabled()

def test_around_fit_contexts_exit_in_reverse_order():
    log = []
    def ctx(name, order_):
        def around_fit(self, trainer):
            log.append(f'enter {name}')
            try: yield
            finally: log.append(f'exit {name}')
        return type(name, (Callback,), {'order': order_, 'around_fit': around_fit})()
    trainer = make_trainer([ctx('A', 0), ctx('B', 1)])
    trainer.fit(1)
    assert log == ['enter A', 'enter B', 'exit B', 'exit A']


def test_callback_added_during_a_phase_runs_in_its_after_and_cleanup():
    "A callback added by another one's `before_fit` takes part in the rest of the fit, `cleanup_fit` included"
    log = []
    class Late(Callback):
        def after_fit(self, trainer): log.append('after_fit')
        def cleanup_fit(self, trainer): log.append('cleanup_fit')
    class Adder(Callback):
        def before_fit(self, trainer): trainer.add_callbacks(Late())
    make_trainer([Adder()]).fit(1)
    assert log == ['after_fit', 'cleanup_fit']


# ---------------------------------------------------------------- 5. on_error policies

class FlakyLogger(Callback):
    "A logger that fails on its first `after_batch`"
    def __init__(self, on_error): self.on_error, self.calls = on_error, 0
    def after_batch(self, trainer):
        self.calls += 1
        raise OSError('disk full')

def _weights(callbacks=()):
    trainer = make_trainer(callbacks)
    trainer.fit(2, lr=0.1)
    return trainer.model.state_dict()

def test_on_error_warn():
    cb = FlakyLogger('warn')
    with pytest.warns(UserWarning) as record: w = _weights([cb])
    msgs = [str(r.message) for r in record if 'FlakyLogger' in str(r.message)]
    assert len(msgs) == 1, msgs
    assert 'after_batch' in msgs[0] and 'OSError' in msgs[0]
    assert cb.calls == 1
    ref = _weights()
    assert w.keys() == ref.keys() and all(torch.equal(w[k], ref[k]) for k in ref)

def test_on_error_warn_disables_only_for_that_fit():
    cb = FlakyLogger('warn')
    trainer = make_trainer([cb])
    with pytest.warns(UserWarning): trainer.fit(1)
    with pytest.warns(UserWarning): trainer.fit(1)
    assert cb.calls == 2

def test_on_error_ignore():
    cb = FlakyLogger('ignore')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        w = _weights([cb])
    assert cb.calls == 2 * 4  # every train and valid batch of both epochs
    ref = _weights()
    assert all(torch.equal(w[k], ref[k]) for k in ref)

def test_ignored_error_runs_each_remaining_handler_once():
    "A handler failing in the middle of an event (here inside the batch's step tuple) neither skips nor repeats the others"
    log = []
    class Rec(Callback):
        def __init__(self, tag, fail=False): self.tag, self.fail, self.on_error = tag, fail, 'ignore'
        def after_predict(self, trainer):
            log.append(self.tag)
            if self.fail: raise ValueError(self.tag)
    trainer, ref = make_trainer([Rec('a'), Rec('b', fail=True), Rec('c')]), make_trainer()
    init = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.fit(1, valid=False); ref.fit(1, valid=False)
    assert log == ['a', 'b', 'c'] * 3  # three training batches
    w, r = trainer.model.state_dict(), ref.model.state_dict()
    assert all(torch.equal(w[k], r[k]) for k in r) and not torch.equal(w['weight'], init['weight'])  # the loss, backward and step still ran

def test_same_function_for_two_events_is_blamed_for_the_right_one():
    "A class may declare one function for several events: a failure names the event that was running"
    calls = []
    def count(self):
        calls.append(len(calls))
        if len(calls) == 2: raise KeyError('second call')
    class Twice(Trainer): callbacks = [('before_predict', count), ('after_predict', count)]
    with pytest.raises(KeyError) as info: make_trainer(cls=Twice).fit(1)
    assert calls == [0, 1] and 'Twice.after_predict' in info.value.__notes__[0]

def test_on_error_default_raises():
    class Logger(Callback):
        def after_batch(self, trainer): raise OSError('disk full')
    with pytest.raises(OSError, match='disk full'): _weights([Logger()])


# ---------------------------------------------------------------- 6. groups and callback state

def test_group_in_fit_leaves_nothing_behind():
    class Member(Callback):
        def __init__(self): self.n = 0
        def after_batch(self, trainer): self.n += 1
    class Group:
        def __init__(self): self.callbacks = [Member(), MetricsCB()]
    group = Group()
    trainer = make_trainer()
    before_cbs, before_attrs = list(trainer.cbs), set(vars(trainer))
    trainer.fit(1, callbacks=[group])
    assert group.callbacks[0].n == 4 and len(group.callbacks[1].losses_epoch) == 1
    assert trainer.cbs == before_cbs
    for name in ('Group', 'Member', 'MetricsCB'): assert not hasattr(trainer, name)
    assert not {a for a in set(vars(trainer)) - before_attrs if a in ('Group', 'Member', 'MetricsCB')}
    # the group also leaves nothing behind when the fit raises
    class Bad(Callback):
        def before_fit(self, trainer): raise ValueError('x')
    group.callbacks.append(Bad())
    with pytest.raises(ValueError): trainer.fit(1, callbacks=[group])
    assert trainer.cbs == before_cbs and not hasattr(trainer, 'Bad')

def test_callbacks_state_dict_round_trip():
    m0, m1 = MetricsCB(), MetricsCB()
    trainer = make_trainer([m0])
    trainer.fit(1)
    trainer.add_callbacks([m1])
    trainer.fit(1)
    assert trainer.MetricsCB is m0 and trainer.MetricsCB_1 is m1
    state = trainer.callbacks_state_dict()
    assert {'MetricsCB', 'MetricsCB_1'} <= set(state)
    assert len(m0.losses_epoch) == 2 and len(m1.losses_epoch) == 1
    assert state['MetricsCB'] != state['MetricsCB_1']
    f0, f1 = MetricsCB(), MetricsCB()
    fresh = make_trainer([f0, f1])
    fresh.load_callbacks_state_dict(state)
    assert f0.losses_epoch == m0.losses_epoch and f1.losses_epoch == m1.losses_epoch

def test_load_callbacks_state_dict_unknown_name():
    trainer = make_trainer([MetricsCB()])
    with pytest.raises(KeyError, match='NoSuchCB'): trainer.load_callbacks_state_dict({'NoSuchCB': {}})


# ---------------------------------------------------------------- 7. trace

def test_trace_events_and_calls():
    trainer = make_trainer()
    with trainer.trace() as t: trainer.fit(1, callbacks=[OneBatchCB()])
    assert t.events == ['before_fit', 'before_train', 'before_epoch', 'before_dataloader', 'after_dataloader', 'before_batch',
                        'before_predict', 'predict', 'after_predict', 'before_loss', 'get_loss', 'after_loss',
                        'before_backward', 'backward', 'after_backward', 'before_step', 'step', 'after_step',
                        'before_zero_grad', 'zero_grad', 'after_zero_grad', 'after_batch', 'cleanup_batch',
                        'cleanup_epoch', 'cleanup_train', 'cleanup_fit']
    predicts = [c for c in t.calls if c[0] == 'predict']
    assert len(predicts) == 1 and predicts[0][1] == 'BasicTrainCB' and predicts[0][2] >= 0
    assert ('after_batch', 'OneBatchCB') in {c[:2] for c in t.calls}
    assert all(s >= 0 for _, _, s in t.calls)
    assert trainer._tracer is None
    # nothing is recorded after the block
    n = len(t.events)
    trainer.fit(1)
    assert len(t.events) == n


@pytest.mark.parametrize('event', ['after_loss', 'after_batch', 'before_fit', 'after_epoch'])
def test_exception_note_in_every_kind_of_event(event):
    "Events run by `run_callbacks` and those run by `with_cbs` (`before_`/`after_` of a phase) both get the note"
    cb = type('Boom', (Callback,), {event: lambda self, trainer: (_ for _ in ()).throw(ValueError('boom'))})()
    with pytest.raises(ValueError) as info: make_trainer([cb]).fit(1)
    assert any('Boom' in n and event in n for n in getattr(info.value, '__notes__', [])), getattr(info.value, '__notes__', None)

def test_every_callback_has_an_empty_state_by_default():
    "A callback without state gives `{}` and accepts `{}`; checkpoints leave such callbacks out"
    class Quiet(Callback):
        def before_fit(self, t): pass
    cb = Quiet()
    assert cb.state_dict() == {}
    cb.load_state_dict({})
    with pytest.raises(NotImplementedError, match=r"Quiet cannot load the state \['x'\]"): cb.load_state_dict({'x': 1})
    t = make_trainer([cb])
    assert 'Quiet' not in t.callbacks_state_dict()
    t.load_callbacks_state_dict({'Quiet': {}})
