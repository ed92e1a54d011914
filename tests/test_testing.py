"""`aisaac.testing`: a callback tested alone with `StubTrainer` behaves as in a real fit (the same stop epoch, the same events),
with the real order, names and error policies; state it was not given is an error that names it and how to give it."""
import pytest
import torch

from aisaac.core.callback import Callback, CancelBatchException, CancelFitException
from aisaac.callbacks.gradients import GradAccumCB
from aisaac.callbacks.monitors import LRMonitorCB
from aisaac.callbacks.stoppers import EarlyStoppingCB, TerminateOnNaNCB
from aisaac.history import RunHistory
from aisaac.testing import StubTrainer
from tiny import Epochs, Script, make_trainer

BATCH = (torch.zeros(4, 2), torch.zeros(4, 1))

def test_three_lines_test_a_callback():
    stub = StubTrainer(TerminateOnNaNCB(), epoch=3, batch_num=7)
    stub.fire('after_loss', loss=torch.tensor(0.25))  # a finite loss: nothing happens
    with pytest.raises(CancelFitException, match='the training loss is nan at epoch 3, batch 7'):
        stub.fire('after_loss', loss=torch.tensor(float('nan')))
    assert stub.printed.startswith('TerminateOnNaNCB: the training loss is nan')  # what it printed is kept, not shown

L = [1.0, 0.9, 0.95, 0.85, 0.86, 0.845, 0.7, 0.6, 0.5, 0.4]
@pytest.mark.parametrize('kw, values', [(dict(), L), (dict(patience=2), L), (dict(patience=2, threshold=0.), L),
                                        (dict(threshold=0.2), [1.0, 0.7, 0.6, 0.3, 0.2]), (dict(patience=3), L)])
def test_early_stopping_stops_where_a_real_fit_does(kw, values):
    stub = StubTrainer(EarlyStoppingCB(**kw))
    n = stub.run_epochs(valid_loss=values)
    count = Epochs()
    trainer = make_trainer([Script(valid_loss=values), EarlyStoppingCB(**kw), count])
    trainer.fit(len(values), lr=0.01)
    assert n == count.n
    assert stub.outcome == trainer.outcome == ('ok' if n == len(values) else 'cancelled')

class Events(Callback):
    "Every event from `before_fit` on, with the `at` of checkpoints"
    seen = ()
    def run_event(self, event, trainer, **kwargs):
        if event == 'before_fit': self.seen = []
        if self.seen != (): self.seen.append(f"{event}:{kwargs['at']}" if 'at' in kwargs else event)

def test_a_fit_of_epochs_fires_the_events_of_the_loop():
    real, stubbed = Events(), Events()
    make_trainer([real], n_train=(4, 4), n_valid=(4,)).fit(2, lr=0.01)
    StubTrainer(stubbed).run_epochs(2, batches=[dict(batch=BATCH)] * 2, valid_batches=[{}])
    assert 'after_step' in real.seen and 'checkpoint:batch' in real.seen and real.seen[-1] == 'cleanup_fit'
    assert stubbed.seen == real.seen

def test_state_not_given_is_an_error_that_names_it_and_the_fix():
    stub = StubTrainer(TerminateOnNaNCB())
    with pytest.raises(AttributeError) as e: stub.fire('after_loss')
    assert "`trainer.loss` was read, and this StubTrainer was not given `loss`" in str(e.value)
    assert 'StubTrainer(cb, loss=...)' in str(e.value) and "stub.fire(event, loss=...)" in str(e.value)
    assert e.value.__notes__[-1].startswith('raised in callback TerminateOnNaNCB.after_loss')
    assert getattr(stub, 'preds', None) is None and not hasattr(stub, 'dls')  # probing for an attribute still works
    with pytest.raises(AttributeError, match='not given `batch`'): stub.run_batch()  # a training batch is counted on the clock

def test_error_policies_are_the_real_ones():
    class Flaky(Callback):
        on_error = 'warn'
        calls = 0
        def after_batch(self, t):
            self.calls += 1
            raise OSError('disk full')
    stub = StubTrainer(flaky := Flaky())
    stub.fire('after_batch'); stub.fire('after_batch')
    assert flaky.calls == 1, 'a callback whose on_error is warn is switched off after its first error'
    assert len(stub.warned) == 1 and 'Flaky.after_batch' in stub.warned[0] and 'disk full' in stub.warned[0]
    stub.run_epochs(1, batches=[dict(batch=BATCH)])
    assert flaky.calls == 2, 'each fit starts with every callback switched on'

    class Boom(Callback):
        order = 7
        def after_batch(self, t): raise ValueError('boom')
    with pytest.raises(ValueError) as e: StubTrainer(Boom(), epoch=2).fire('after_batch')
    assert e.value.__notes__[-1].startswith('raised in callback Boom.after_batch (order 7), epoch 2')
    Boom.on_error = 'ignore'
    stub = StubTrainer(Boom())
    stub.fire('after_batch')
    assert stub.warned == []

def test_order_names_and_hook_checks_are_the_real_ones():
    class Rec(Callback):
        def __init__(self, log, tag, order=0): self.log, self.tag, self.order = log, tag, order
        def before_fit(self, t): self.log.append(self.tag)
    log = []
    stub = StubTrainer(Rec(log, 'late', 10), Rec(log, 'a'), Rec(log, 'early', -5), Rec(log, 'b'))
    stub.fire('before_fit')
    assert log == ['early', 'a', 'b', 'late']
    assert [stub.Rec.tag, stub.Rec_1.tag, stub.Rec_3.tag] == ['late', 'a', 'b']
    class Typo(Callback):
        def after_bacth(self, t): pass
    with pytest.raises(AttributeError, match="did you mean 'after_batch'"): StubTrainer(Typo())
    class Lightning(Callback):
        def on_train_batch_end(self, t): pass
    with pytest.raises(AttributeError, match='aisaac calls it `after_batch`'): StubTrainer(Lightning())

def test_fire_returns_what_was_logged():
    stub = StubTrainer(LRMonitorCB(), lr=0.5)
    assert stub.fire('after_step') == {'lr': 0.5, 'momentum': 0.0}
    stub.opt.param_groups[0]['lr'] = 0.25
    assert stub.fire('after_step') == {'lr': 0.25, 'momentum': 0.0}
    assert [(r['step'], r['per']) for r in stub.logged] == [(0, 'batch'), (1, 'batch')]  # steps counted as the trainer counts them
    assert stub.history.get_metric_values('lr', per='batch') == [0.5, 0.25] and stub.clock.step == 2

def test_a_stop_request_ends_the_fit_at_the_epochs_checkpoint():
    class Asks(Callback):
        def after_epoch(self, t): t.request_stop('enough')
    stub = StubTrainer(Asks())
    stub.fire('after_epoch')
    stub.fire('checkpoint', at='batch')  # not here: at the end of the epoch, after its checkpoints
    with pytest.raises(CancelFitException, match='enough'): stub.fire('checkpoint', at='epoch')
    assert StubTrainer(Asks()).run_epochs(5) == 1

def test_run_batch_cancels_and_skipped_steps_as_in_the_loop():
    class Skips(Callback):
        def __init__(self): self.reasons = []
        def step_skipped(self, t, reason): self.reasons.append(reason)
    stub = StubTrainer(GradAccumCB(2), skips := Skips(), batch=BATCH, loss=torch.tensor(1.0, requires_grad=True))
    stub.fire('before_fit')
    for _ in range(4): stub.run_batch()
    assert (stub.clock.step, stub.clock.micro_step, stub.clock.samples) == (2, 4, 16)
    assert skips.reasons == ['gradient accumulation: batch 1 of 2, the step comes after batch 2'] * 2

    class Skip(Callback):
        def after_loss(self, t): raise CancelBatchException()
        def after_batch(self, t): t.reached = 'after_batch'
        def cleanup_batch(self, t): t.cleaned = t.outcome
    stub = StubTrainer(Skip(), batch=BATCH, training=False)
    stub.run_batch()  # caught by the batch phase, as in a fit
    assert stub.cleaned == 'cancelled' and getattr(stub, 'reached', None) is None
    with pytest.raises(CancelBatchException): stub.fire('after_loss')  # fired alone, it comes out

def test_state_is_checked_and_converted():
    stub = StubTrainer(history={'valid_loss': [0.9, 0.8]}, clock={'step': 10, 'epoch': 2}, training=False)
    assert isinstance(stub.history, RunHistory) and stub.history.get_metric_values('valid_loss') == [0.9, 0.8]
    assert (stub.clock.step, stub.clock.epoch, stub.training, stub.model.training) == (10, 2, False, False)
    with pytest.raises(ValueError, match="'steps'"): StubTrainer(clock={'steps': 10})
    with pytest.raises(ValueError, match='`fire` is a method of the Trainer'): StubTrainer(fire=1)
    with pytest.raises(ValueError, match='`TerminateOnNaNCB` is the name of a callback'): StubTrainer(TerminateOnNaNCB()).fire('after_batch', TerminateOnNaNCB=1)
    with pytest.raises(ValueError, match="did you mean 'after_batch'"): stub.fire('after_bacth')
    with pytest.raises(TypeError, match="at='epoch'"): stub.fire('checkpoint')
    with pytest.raises(ValueError, match='one value per epoch'): stub.run_epochs(valid_loss=[1.0], accuracy=[0.5, 0.6])
    with pytest.raises(NotImplementedError, match='run_epochs'): stub.fit(1)
    assert len(StubTrainer([Epochs(), Epochs()]).cbs) == 2  # a list of callbacks, as `Trainer(callbacks=...)` takes it

class FailsAtEpoch(Callback):
    "Raises ValueError at the end of epoch 1's validation pass"
    def after_epoch(self, trainer):
        if trainer.epoch == 1 and not trainer.training: raise ValueError('bad epoch 1')

class Alarm(Callback):
    "Sends a text and keeps the exception when the fit fails"
    def on_exception(self, trainer, exception):
        self.got = exception
        trainer.log_text('alarm', f'failed: {exception}')

def test_a_failing_run_of_epochs_fires_on_exception_as_a_real_fit_does():
    stub = StubTrainer(FailsAtEpoch(), a := Alarm())
    with pytest.raises(ValueError, match='bad epoch 1') as info:
        stub.run_epochs(3, valid_batches=[{}])  # one validation batch, as the real fit's
    assert a.got is info.value and stub.texts == [{'name': 'alarm', 'text': 'failed: bad epoch 1', 'step': None}]
    real = make_trainer([FailsAtEpoch(), alarm := Alarm()], n_valid=(4,))
    with pytest.raises(ValueError, match='bad epoch 1') as rinfo:
        real.fit(3, lr=0.01)
    assert alarm.got is rinfo.value and rinfo.value.__notes__ == info.value.__notes__  # the same error, with the same note
    class Escapes(Callback):
        def after_epoch(self, trainer): raise CancelBatchException()  # a cancel where nothing catches it
    with pytest.raises(RuntimeError, match='CancelBatchException was raised in Escapes.after_epoch, where nothing catches it'):
        StubTrainer(Escapes()).run_epochs(1)

def test_images_and_texts_are_kept():
    class Shows(Callback):
        def after_epoch(self, trainer):
            if not trainer.training: trainer.log_image('preds', torch.zeros(3, 4, 4), step=trainer.epoch); trainer.log_text('note', 'hi', step=trainer.epoch)
    stub = StubTrainer(Shows())
    stub.run_epochs(2)
    assert [(i['name'], i['step'], tuple(i['image'].shape)) for i in stub.images] == [('preds', 0, (3, 4, 4)), ('preds', 1, (3, 4, 4))]
    assert stub.texts == [{'name': 'note', 'text': 'hi', 'step': 0}, {'name': 'note', 'text': 'hi', 'step': 1}]
