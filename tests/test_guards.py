"""A catalogue of bad inputs and faults (issue 10): each case asserts the exact outcome, the error's type and that its
message names the problem and the fix, that nothing trained where a fit was refused, and that cleanups and
`on_exception` handlers all ran when handlers failed."""
import copy, gzip, importlib, math, struct, sys, types, warnings
from pathlib import Path
import numpy as np, pytest, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from fastcore.foundation import L

import aisaac.data as data
from aisaac.all import (Callback, CallbackMixin, CancelBackwardException, CancelBatchException, CancelEpochException,
                         CancelFitException, Trainer, register_global_callback, with_cbs)
from aisaac.callbacks.train import BasicTrainCB, MomentumTrainCB, OneBatchCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.data import DataLoaders, TensorLoader, load_fashion_mnist, read_idx, to_tensors
from tiny import make_dls, make_trainer


# ---------------------------------------------------------------- helpers

def weights(t): return {k: v.detach().clone() for k, v in t.model.state_dict().items()}
def same(a, b): return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

def refused(trainer, exc, *parts, **fit_kwargs):
    "Fit `trainer` with `fit_kwargs`, expecting `exc` with every one of `parts` in its message; the weights and callbacks must not change"
    w, cbs = weights(trainer), list(trainer.cbs)
    with pytest.raises(exc) as info: trainer.fit(**fit_kwargs)
    msg = str(info.value)
    for p in parts: assert p in msg, (p, msg)
    assert same(weights(trainer), w), 'a refused fit changed the weights'
    assert trainer.cbs == cbs
    return info.value

def dls_of(train, valid=None): return types.SimpleNamespace(train=train, valid=train if valid is None else valid)

def xy(n=8, n_out=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, generator=g), torch.randn(n, n_out, generator=g)

class Recorder(Callback):
    "Records the events it is given as instance hooks"
    def __init__(self, log, tag, *events, fail=None):
        self.log, self.tag, self.fail = log, tag, fail
        for ev in events: setattr(self, ev, self._hook(ev))
    def _hook(self, ev):
        def f(trainer, **kwargs):
            self.log.append((self.tag, ev))
            if self.fail is not None: raise self.fail
        return f

class Raise(Callback):
    "Raises `exc` in `event`"
    def __init__(self, event, exc): setattr(self, event, lambda trainer: (_ for _ in ()).throw(exc() if isinstance(exc, type) else exc))


# ---------------------------------------------------------------- 1. a fit that does nothing is refused, and changes nothing

@pytest.mark.parametrize('kwargs, exc, parts', [
    (dict(n_epochs=-2), ValueError, ['`n_epochs` must be a whole number of epochs, 1 or more', '-2']),
    (dict(n_epochs=0), ValueError, ['1 or more (got 0)']),
    (dict(n_epochs=2.5), ValueError, ['whole number', '2.5']),
    (dict(n_epochs=True), ValueError, ['whole number', 'True']),
    (dict(n_epochs='3'), ValueError, ['whole number', "'3'"]),
    (dict(lr=float('nan')), ValueError, ['`lr` must be a finite number, 0 or more', 'nan']),
    (dict(lr=float('inf')), ValueError, ['finite number', 'inf']),
    (dict(lr=-0.1), ValueError, ['0 or more', '-0.1']),
    (dict(lr='1e-3'), ValueError, ["got '1e-3'", 'pass `lr=0.001`']),
    (dict(lr=None), ValueError, ['finite number', 'None']),
    (dict(train=False, valid=False), ValueError, ['would run nothing', 'leave one of them True']),
    (dict(train='yes'), TypeError, ['`train` must be True or False', "'yes'"]),
])
def test_bad_fit_arguments_are_refused_before_anything_changes(kwargs, exc, parts):
    trainer = make_trainer()
    refused(trainer, exc, *parts, **kwargs)
    trainer.fit(1)  # the trainer is still usable

def test_numpy_integers_and_zero_dim_tensor_lr_are_accepted():
    trainer = make_trainer()
    trainer.fit(np.int64(1), lr=torch.tensor(0.01))
    assert trainer.n_epochs == 1

@pytest.mark.parametrize('which', ['train', 'valid'])
def test_a_none_loader_is_refused_with_the_fix(which):
    dls = make_dls(); setattr(dls, which, None)
    trainer = make_trainer(dls=dls)
    refused(trainer, TypeError, f'`dls.{which}` is None', f'fit({which}=False)')
    trainer.fit(1, **{which: False})

@pytest.mark.parametrize('empty', [[], DataLoader(TensorDataset(torch.zeros(0, 2), torch.zeros(0, 1)), batch_size=4),
                                   TensorLoader(torch.zeros(3, 2), torch.zeros(3, 1), bs=4, drop_last=True)])
def test_an_empty_training_loader_is_an_error(empty):
    trainer = make_trainer(dls=dls_of(empty, make_dls().valid))
    refused(trainer, ValueError, '`dls.train` gave no batch in epoch 0', 'it is empty', 'drop_last=True', n_epochs=1)

def test_an_empty_validation_loader_is_an_error():
    trainer = make_trainer(dls=dls_of(make_dls().train, []))
    with pytest.raises(ValueError, match=r'`dls.valid` gave no batch in epoch 0, so this pass would do nothing'): trainer.fit(1)

def test_a_one_shot_generator_is_an_error_in_the_second_epoch():
    gen = (b for b in make_dls().train)
    trainer = make_trainer(dls=dls_of(gen, make_dls().valid))
    with pytest.raises(ValueError) as info: trainer.fit(2)
    msg = str(info.value)
    assert 'gave no batch in epoch 1' in msg and 'it is an iterator' in msg and 'pass a list, a torch DataLoader or a TensorLoader' in msg

def test_nothing_handling_predict_is_refused_naming_basic_train_cb():
    torch.manual_seed(0)
    trainer = Trainer(make_dls(), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1))
    refused(trainer, RuntimeError, 'Nothing handles `predict`', 'no predictions would be made', 'add `BasicTrainCB()`')

class PredictLoss(Callback):
    def predict(self, t): t.preds = t.model(t.batch[0])
    def get_loss(self, t): t.loss = t.loss_func(t.preds, t.batch[1])

def test_a_fit_that_stops_before_the_steps_needs_no_step_handler():
    class Peek(Callback):  # h12b's `peek_batch` does this: the batch as the model would get it, without training
        def before_predict(self, t):
            self.batch = t.batch
            raise CancelFitException()
    torch.manual_seed(0)
    trainer = Trainer(make_dls(), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=(peek := Peek()))
    w = weights(trainer); trainer.fit(1)
    assert peek.batch[0].shape == (3, 2) and same(weights(trainer), w)

def test_a_catch_all_callback_is_no_step_handler():
    class Watch(Callback):
        def run_event(self, event, trainer, **kwargs): pass
    torch.manual_seed(0)
    trainer = Trainer(make_dls(), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=Watch())
    refused(trainer, RuntimeError, 'Nothing handles `predict`')

def test_a_training_fit_without_backward_is_refused_but_validation_alone_runs():
    torch.manual_seed(0)
    trainer = Trainer(make_dls(), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=PredictLoss())
    refused(trainer, RuntimeError, 'Nothing handles `backward`', 'the weights would never change')
    trainer.fit(1, train=False)
    assert trainer.loss.ndim == 0

def test_two_core_step_handlers_are_refused():
    trainer = make_trainer([MomentumTrainCB()])
    refused(trainer, RuntimeError, '`backward` has 2 handlers (BasicTrainCB.backward, MomentumTrainCB.backward)', 'keep one')

def test_a_callback_that_only_watches_a_step_is_allowed():
    class Count(Callback):
        n = 0
        def step(self, t): self.n += 1
    trainer = make_trainer([c := Count()])
    trainer.fit(1)
    assert c.n == 2

def test_a_subclass_with_its_own_batch_needs_no_step_handler():
    class Inline(Trainer):
        @with_cbs('batch', CancelBatchException)
        def one_batch(self):
            self.preds = self.model(self.batch[0]); self.loss = self.loss_func(self.preds, self.batch[1])
            if self.training: self.loss.backward(); self.opt.step(); self.opt.zero_grad()
    torch.manual_seed(0)
    t = Inline(make_dls(), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1))
    w = weights(t); t.fit(1, lr=0.1)
    assert not same(weights(t), w)


# ---------------------------------------------------------------- 2. stale state

def test_each_fit_starts_with_zeroed_gradients():
    class StopAfterBackward(Callback):
        def after_backward(self, t): raise KeyboardInterrupt
    one = dls_of(make_dls().train[:1])
    interrupted = make_trainer(dls=one)
    with pytest.raises(KeyboardInterrupt): interrupted.fit(1, callbacks=StopAfterBackward())
    assert interrupted.model.weight.grad is not None  # the interrupted fit left its gradients
    interrupted.fit(1, lr=0.1)
    fresh = make_trainer(dls=one)
    fresh.fit(1, lr=0.1)
    assert same(weights(interrupted), weights(fresh))

def test_a_fit_inside_a_fit_is_refused_and_the_outer_fit_is_untouched():
    class Nested(Callback):
        def after_batch(self, t):
            self.seen = (t.n_epochs, t.lr, t.opt)
            t.fit(5, lr=1.)
    cb = Nested()
    trainer = make_trainer([cb])
    with pytest.raises(RuntimeError) as info: trainer.fit(2, lr=0.01)
    assert 'fit() was called while this trainer is fitting' in str(info.value) and 'Call it after the fit returns' in str(info.value)
    assert 'raised in callback Nested.after_batch' in ' '.join(info.value.__notes__)
    assert (trainer.n_epochs, trainer.lr, trainer.opt) == cb.seen == (2, 0.01, cb.seen[2])
    trainer.remove_callbacks(cb)
    trainer.fit(1)  # and fits again once it returned


# ---------------------------------------------------------------- 3. training on the wrong thing

def test_a_bare_tensor_batch_is_refused():
    x, _ = xy()
    trainer = make_trainer(dls=dls_of([x]))
    refused(trainer, TypeError, 'a batch that is one tensor (shape (8, 2))', '(inputs, targets) tuples', 'TensorDataset(x, y)')

def test_a_one_element_batch_is_refused():
    x, _ = xy()
    dl = DataLoader(TensorDataset(x), batch_size=4)
    trainer = make_trainer(dls=dls_of(dl))
    refused(trainer, ValueError, 'a batch of 1 item(s)', 'leaves no target', 'TensorDataset(x, y)', '`(x, x)` if the inputs are the targets')

@pytest.mark.parametrize('y_shape', [(8,), (8, 1, 1)])
def test_shapes_that_broadcast_into_a_matrix_are_refused(y_shape):
    x, y = xy()
    trainer = make_trainer(dls=dls_of([(x, y.reshape(y_shape))]))
    refused(trainer, ValueError, 'would broadcast into (8, 8', 'comparing every prediction with every target', 'same shape')

def test_predictions_of_n_classes_against_n_labels_are_not_refused():
    x, _ = xy(n=4)
    torch.manual_seed(0)
    t = Trainer(dls_of([(x, torch.tensor([0, 1, 2, 3]))]), nn.CrossEntropyLoss(), torch.optim.SGD, nn.Linear(2, 4), callbacks=BasicTrainCB())
    t.fit(1)  # (4, 4) predictions against (4,) labels: cross-entropy's usual shapes, batch size equal to the number of classes

def test_first_batch_errors_get_a_note_describing_the_batch():
    x, y = xy()
    trainer = make_trainer(dls=dls_of([(x[:, :1], y)]))  # the model wants 2 features
    with pytest.raises(RuntimeError) as info: trainer.fit(1)
    notes = ' '.join(info.value.__notes__)
    assert 'BasicTrainCB ran the model on the inputs of a batch that is a tuple of 2: (tensor (8, 1) float32, tensor (8, 1) float32)' in notes

def test_n_inp_passes_several_inputs():
    class Two(nn.Module):
        def __init__(self): super().__init__(); self.lin = nn.Linear(2, 1)
        def forward(self, x, scale): return self.lin(x) * scale
    x, y = xy()
    torch.manual_seed(0)
    t = Trainer(dls_of([(x, torch.ones(8, 1), y)]), nn.MSELoss(), torch.optim.SGD, Two(), callbacks=BasicTrainCB(n_inp=2))
    t.fit(1)
    assert t.preds.shape == (8, 1)
    with pytest.raises(ValueError, match=r'`n_inp` is how many items .* 1 or more \(got 0\)'): BasicTrainCB(n_inp=0)

def test_a_batch_of_another_type_is_refused():
    trainer = make_trainer(dls=dls_of(['not a batch']))
    refused(trainer, TypeError, 'cannot read a batch of type str', 'subclass BasicTrainCB and write `predict` and `get_loss`')


# ---------------------------------------------------------------- 4. dict batches

def dict_batches(target='label', extra=None):
    return [{'x': x, target: y, **(extra or {})} for x, y in make_dls().train]

def trained_weights(dls, cb):
    torch.manual_seed(0)
    t = Trainer(dls, nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[cb])
    t.fit(2, lr=0.1)
    return weights(t)

def test_dict_batches_train_like_tuples():
    d = trained_weights(dls_of(dict_batches()), BasicTrainCB())
    assert same(d, trained_weights(dls_of(make_dls().train), BasicTrainCB()))

def test_dict_batches_with_a_named_target_key():
    d = trained_weights(dls_of(dict_batches('answer')), BasicTrainCB(target_key='answer'))
    assert same(d, trained_weights(dls_of(make_dls().train), BasicTrainCB()))

def test_a_dict_batch_without_a_known_target_is_an_error_naming_the_keys():
    trainer = make_trainer(dls=dls_of(dict_batches('answer')))
    refused(trainer, KeyError, "keys ['x', 'answer']", 'BasicTrainCB(target_key=..., input_keys=...)')

def test_input_keys_by_name_and_by_position():
    class Named(nn.Module):
        def __init__(self): super().__init__(); self.lin = nn.Linear(2, 1)
        def forward(self, x, mask): return self.lin(x) * mask
    batches = dict_batches(extra={'mask': torch.ones(3, 1)})[:1]
    torch.manual_seed(0)
    t = Trainer(dls_of(batches), nn.MSELoss(), torch.optim.SGD, Named(), callbacks=BasicTrainCB(input_keys=['x', 'mask']))
    t.fit(1)
    torch.manual_seed(0)
    t = Trainer(dls_of(batches), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=BasicTrainCB(input_keys='x'))
    t.fit(1)  # one key given as a string: passed by position, `mask` ignored

def test_a_torch_dataloader_of_dict_rows_trains():
    x, y = xy(n=12)
    rows = [{'image': a, 'label': b} for a, b in zip(x, y)]
    dl = DataLoader(rows, batch_size=4)  # default_collate makes a dict batch
    torch.manual_seed(0)
    t = Trainer(dls_of(dl), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=BasicTrainCB())
    t.fit(1)
    assert t.batch_num == 3

def test_the_layout_is_read_again_when_the_loader_changes():
    trainer = make_trainer(dls=dls_of(make_dls().train, dict_batches()[:1]))  # tuples to train, dicts to validate
    trainer.fit(2)


# ---------------------------------------------------------------- 5. non-finite losses

def nan_dls(value=float('nan')):
    dls = make_dls()
    dls.train[1][1][0] = value
    return dls

@pytest.mark.parametrize('value, shown', [(float('nan'), 'nan'), (float('inf'), 'inf')])
def test_a_non_finite_training_loss_is_an_error_naming_epoch_and_batch(value, shown):
    trainer = make_trainer(dls=nan_dls(value))
    with pytest.raises(FloatingPointError) as info: trainer.fit(3)
    msg = str(info.value)
    assert f'The training loss is {shown} at the end of epoch 0' in msg and 'after 2 batches' in msg
    assert 'Lower the learning rate' in msg and "trainer.nonfinite_loss = 'warn'" in msg
    assert trainer.epoch == 0  # it stopped in the first epoch

def test_nonfinite_loss_warn_and_none():
    trainer = make_trainer(dls=nan_dls())
    trainer.nonfinite_loss = 'warn'
    with pytest.warns(UserWarning, match='The training loss is nan'): trainer.fit(2)
    assert trainer.epoch == 1
    trainer.nonfinite_loss = None
    with warnings.catch_warnings(): warnings.simplefilter('error'); trainer.fit(1)

def test_the_loss_is_read_once_per_epoch_not_per_batch(monkeypatch):
    reads = []
    orig = Trainer._check_loss
    monkeypatch.setattr(Trainer, '_check_loss', lambda self: (reads.append(self.batch_num), orig(self)))
    make_trainer().fit(3)
    assert reads == [2, 2, 2]  # once per training pass, after its 2 batches

def test_a_non_finite_validation_loss_alone_is_no_training_error():
    dls = make_dls()
    dls.valid[0][1][0] = float('nan')
    make_trainer(dls=dls).fit(1)


# ---------------------------------------------------------------- 6. callback registration

@pytest.mark.parametrize('make', [lambda cbs: (c for c in cbs), lambda cbs: L(cbs), tuple, list, lambda cbs: dict(enumerate(cbs)).values()])
def test_callbacks_as_any_ordered_iterable_add_their_items(make):
    class A(Callback):
        def before_fit(self, t): self.ran = True
    a, b = A(), A()
    trainer = make_trainer()
    trainer.fit(1, callbacks=make([a, b]))
    assert a.ran and b.ran and not hasattr(trainer, 'A')

@pytest.mark.parametrize('coll, fix', [({Callback()}, 'pass a list instead'), ({'m': Callback()}, '`list(d.values())`')])
def test_unordered_collections_of_callbacks_are_refused(coll, fix):
    trainer = make_trainer()
    refused(trainer, TypeError, 'which has no order', fix, callbacks=coll)
    g = Group(); g.callbacks = coll  # a group's members, too
    with pytest.raises(TypeError, match='which has no order'): make_trainer([g])

def test_a_collection_nested_in_the_callbacks_is_refused():
    with pytest.raises(TypeError, match=r'A list among the callbacks is no callback: pass one flat list'): make_trainer([[Callback()]])

class Group(Callback):
    def __init__(self, *members): self.callbacks = list(members)

def test_a_group_containing_itself_is_an_error_naming_the_cycle():
    g = Group(); g.callbacks.append(g)
    with pytest.raises(ValueError, match=r'contains itself \(Group -> Group\)'): make_trainer([g])
    class Inner(Group): pass
    outer = Group(inner := Inner()); inner.callbacks.append(outer)
    with pytest.raises(ValueError, match=r'\(Group -> Inner -> Group\).*remove it'): make_trainer([outer])

def test_deep_groups_do_not_hit_the_recursion_limit():
    class Leaf(Callback):
        n = 0
        def before_fit(self, t): Leaf.n += 1
    g = Leaf()
    for _ in range(sys.getrecursionlimit() + 100): g = Group(g)
    trainer = make_trainer()
    trainer.fit(1, callbacks=g)
    assert Leaf.n == 1 and trainer.cbs == [trainer.BasicTrainCB]

def test_a_generator_as_a_groups_members_is_refused():
    g = Group(); g.callbacks = (c for c in [Callback()])
    with pytest.raises(TypeError, match='Group.callbacks is a one-shot iterator: make it a list'): make_trainer([g])

@pytest.mark.parametrize('name, event', [
    ('on_train_batch_end', '`after_batch` (in training'), ('on_epoch_end', '`after_epoch`'), ('on_fit_start', '`before_fit`'),
    ('on_train_begin', '`before_fit`'), ('on_training_run_start', '`before_fit`'), ('on_validation_epoch_end', '`after_validate`'),
    ('fit_start', '`before_fit`'), ('before_forward', '`before_predict`'), ('after_pred', '`after_predict`'),
    ('on_stop_training_error', '`on_exception`'), ('on_before_optimizer_step', '`before_step`'), ('after_cancel_batch', '`cleanup_batch`'),
])
def test_other_libraries_hook_names_are_refused_with_the_event_to_use(name, event):
    cb = type('Foreign', (Callback,), {name: lambda self, t: None})()
    with pytest.raises(AttributeError) as info: make_trainer([cb])
    assert f"Foreign.{name} is another library's hook name" in str(info.value) and f'aisaac calls it {event}' in str(info.value)

def test_a_foreign_name_listed_in_custom_events_is_accepted():
    cb = type('Mine', (Callback,), {'custom_events': ('on_epoch_end',), 'on_epoch_end': lambda self, t: None})()
    make_trainer([cb])

def test_global_callbacks_get_the_hook_checks():
    class Typo(Callback):
        def after_bacth(self, t): pass
    with pytest.raises(AttributeError, match="did you mean 'after_batch'"): register_global_callback(Typo())
    class Foreign(Callback):
        def on_train_batch_end(self, t): pass
    with pytest.raises(AttributeError, match='aisaac calls it `after_batch`'):
        with Foreign(): pass

def test_the_same_instance_cannot_be_global_and_local():
    class Both(Callback):
        def before_fit(self, t): pass
    b = Both()
    trainer = make_trainer([b])
    with pytest.raises(ValueError, match='is a callback of a Trainer already.*remove it from there first'): register_global_callback(b)
    g = Both()
    with g:
        with pytest.raises(ValueError, match='is a global callback already, so it runs in every fit'): trainer.fit(1, callbacks=g)
        trainer.fit(1)

@pytest.mark.parametrize('policy', ['warning', 'Raise', None])
def test_on_error_values_are_validated(policy):
    cb = type('Bad', (Callback,), {'on_error': policy})()
    with pytest.raises(ValueError, match=r"Bad.on_error is .* use 'raise' \(the default\), 'warn' or 'ignore'"): make_trainer([cb])
    with pytest.raises(ValueError, match='no error policy'): register_global_callback(cb)

@pytest.mark.parametrize('name', ['loss', 'preds', 'batch', 'dl', 'opt', 'model', 'epoch', 'history'])
def test_callback_classes_named_like_runtime_attributes_are_refused(name):
    cb = type(name, (Callback,), {})()
    with pytest.raises(ValueError) as info: make_trainer([cb])
    assert f'`trainer.{name}`' in str(info.value) and 'rename the class, e.g.' in str(info.value)


# ---------------------------------------------------------------- 7. a trainer subclass with its own steps

class TrainLearner(Trainer):  # the fastai course's pattern
    def predict(self): self.preds = self.model(self.batch[0])
    def get_loss(self): self.loss = self.loss_func(self.preds, self.batch[1])
    def backward(self): self.loss.backward()
    def step(self): self.opt.step()
    def zero_grad(self): self.opt.zero_grad()

class MomentumLearner(TrainLearner):
    def __init__(self, *args, mom=0.85, **kwargs):
        self.mom = mom
        super().__init__(*args, **kwargs)
    def zero_grad(self):
        with torch.no_grad():
            for p in self.model.parameters(): p.grad *= self.mom

def learner(cls, callbacks=(), **kw):
    torch.manual_seed(0)
    return cls(make_dls(), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=list(callbacks), **kw)

def test_a_trainer_subclass_steps_train_like_basic_train_cb():
    t = learner(TrainLearner); t.fit(2, lr=0.1)
    ref = make_trainer(); ref.fit(2, lr=0.1)
    assert same(weights(t), weights(ref))

def test_an_overriding_step_runs_alone():
    t = learner(MomentumLearner); t.fit(2, lr=0.1)
    ref = make_trainer(); ref.remove_callbacks(ref.BasicTrainCB); ref.add_callbacks(MomentumTrainCB(0.85)); torch.manual_seed(0)
    ref.model = copy.deepcopy(learner(TrainLearner).model); ref.fit(2, lr=0.1)
    assert same(weights(t), weights(ref))

def test_the_own_steps_run_among_order_zero_after_negative_orders():
    log = []
    class Spy(TrainLearner):
        def predict(self): log.append(('own', 'predict')); super().predict()
    early = Recorder(log, 'early', 'predict'); early.order = -1
    t = learner(Spy, [Recorder(log, 'late', 'predict'), early])
    t.fit(1, train=False)
    assert log[:3] == [('early', 'predict'), ('own', 'predict'), ('late', 'predict')]

def test_own_steps_and_basic_train_cb_are_refused_together():
    t = learner(TrainLearner, [BasicTrainCB()])
    refused(t, RuntimeError, '`backward` has 2 handlers (TrainLearner.backward, BasicTrainCB.backward)')

def test_a_step_method_that_takes_data_is_refused_at_class_creation():
    with pytest.raises(TypeError, match=r'Bad.predict runs as the `predict` step.*rename it if it is not that step \(e.g. `get_preds`'):
        class Bad(Trainer):
            def predict(self, dl): pass

@pytest.mark.parametrize('name, use', [('optimizer_step', '`step`'), ('calculate_train_batch_loss', '`predict` and `get_loss`'),
                                       ('backward_step', '`backward`')])
def test_other_libraries_step_names_are_refused(name, use):
    with pytest.raises(TypeError, match=f"{name} is another library's name for a step.*name it {use}"):
        type('PA', (Trainer,), {name: lambda self: None})

def test_an_error_in_an_own_step_names_it():
    class Broken(TrainLearner):
        def get_loss(self): raise ValueError('bad loss')
    t = learner(Broken)
    with pytest.raises(ValueError, match='bad loss') as info: t.fit(1)
    assert info.value.__notes__ == ['raised in callback Broken.get_loss (order 0), epoch 0, batch 0']


# ---------------------------------------------------------------- 8. the dispatch survives its own handlers failing

def test_every_cleanup_runs_and_the_original_error_wins():
    log = []
    cbs = [Recorder(log, 'a', 'cleanup_fit', fail=OSError('a broke')), Recorder(log, 'b', 'cleanup_fit', fail=KeyError('b broke')),
           Recorder(log, 'c', 'cleanup_fit'), Raise('after_batch', ValueError('the real problem'))]
    with pytest.raises(ValueError, match='the real problem') as info: make_trainer(cbs).fit(1)
    assert log == [('a', 'cleanup_fit'), ('b', 'cleanup_fit'), ('c', 'cleanup_fit')]
    notes = info.value.__notes__
    assert notes[0] == 'raised in callback Raise.after_batch (order 0), epoch 0, batch 0'
    assert notes[1].startswith('also raised on the way out: OSError: a broke') and 'Recorder.cleanup_fit' in notes[1]
    assert notes[2].startswith("also raised on the way out: KeyError: 'b broke'") and 'Recorder_1.cleanup_fit' in notes[2]

def test_a_failing_cleanup_without_an_error_is_raised_after_every_cleanup_ran():
    log = []
    cbs = [Recorder(log, 'a', 'cleanup_epoch', fail=OSError('a broke')), Recorder(log, 'b', 'cleanup_epoch')]
    with pytest.raises(OSError, match='a broke') as info: make_trainer(cbs).fit(1)
    assert log == [('a', 'cleanup_epoch'), ('b', 'cleanup_epoch')]
    assert info.value.__notes__[0].startswith('raised in callback Recorder.cleanup_epoch')

def test_every_on_exception_handler_runs_and_the_original_error_wins():
    log = []
    cbs = [Recorder(log, 'a', 'on_exception', fail=RuntimeError('handler broke')), Recorder(log, 'b', 'on_exception'),
           Raise('before_fit', ValueError('the real problem'))]
    with pytest.raises(ValueError, match='the real problem') as info: make_trainer(cbs).fit(1)
    assert log == [('a', 'on_exception'), ('b', 'on_exception')]
    assert any(n.startswith('also raised on the way out: RuntimeError: handler broke') for n in info.value.__notes__)

class Around(Callback):
    def __init__(self, kind): self.kind = kind
    def around_batch(self, t):
        if self.kind == 'no yield': return
        if self.kind == 'swallow':
            try: yield
            except Exception: pass
            return
        yield
        if self.kind == 'twice': yield

@pytest.mark.parametrize('kind, exc, msg', [('no yield', RuntimeError, 'Around.around_batch returned without yielding'),
                                            ('twice', RuntimeError, 'Around.around_batch yielded more than once')])
def test_a_misbehaving_around_hook_is_a_clear_error(kind, exc, msg):
    trainer = make_trainer([Around(kind)])
    with pytest.raises(exc, match=msg) as info: trainer.fit(1)
    assert 'raised in callback Around.around_batch (order 0), epoch 0, batch 0' in info.value.__notes__

def test_an_around_hook_that_swallows_an_error_does_not_hide_it():
    trainer = make_trainer([Around('swallow'), Raise('after_loss', ValueError('the real problem'))])
    with pytest.raises(ValueError, match='the real problem') as info: trainer.fit(1)
    assert any('Around.around_batch swallowed ValueError: an around_ hook must let exceptions through' in n for n in info.value.__notes__)

def test_an_around_hook_that_swallows_a_cancel_is_an_error():
    trainer = make_trainer([Around('swallow'), Raise('after_loss', CancelBatchException)])
    with pytest.raises(RuntimeError, match='swallowed CancelBatchException'): trainer.fit(1)

def test_an_around_hook_honours_on_error():
    class Flaky(Callback):
        on_error = 'warn'
        def around_batch(self, t):
            raise OSError('no profiler here')
            yield
    trainer = make_trainer([Flaky()])
    with pytest.warns(UserWarning, match='Flaky.around_batch .* raised OSError: no profiler here; the callback is disabled'): trainer.fit(1)
    assert trainer.epoch == 0 and trainer.batch_num == 1  # the fit went on to the end

def test_around_hooks_entered_before_a_failing_one_are_exited():
    class Ctx(Callback):
        order = -1
        def around_batch(self, t):
            self.state = 'in'
            try: yield
            finally: self.state = 'out'
    ctx = Ctx()
    trainer = make_trainer([ctx, Around('no yield')])
    with pytest.raises(RuntimeError, match='returned without yielding'): trainer.fit(1)
    assert ctx.state == 'out'

def test_an_around_method_that_is_no_generator_is_refused_when_added():
    cb = type('Plain', (Callback,), {'around_fit': lambda self, t: None})()
    with pytest.raises(TypeError, match='Plain.around_fit must be a generator that yields once'): make_trainer([cb])

def test_a_metric_error_is_not_masked_by_metrics_cb():
    class BadMetric:
        def update(self, preds, targets): raise ValueError('update broke')
        def compute(self): raise ZeroDivisionError('nothing to compute')
        def reset(self): pass
    trainer = make_trainer([MetricsCB(bad=BadMetric())])
    with pytest.raises(ValueError, match='update broke') as info: trainer.fit(1)
    notes = info.value.__notes__
    assert notes[0].startswith('raised in callback MetricsCB.after_batch')
    assert any('ZeroDivisionError: nothing to compute' in n and 'MetricsCB.cleanup_epoch' in n for n in notes)

def test_a_metric_without_update_and_compute_is_refused():
    with pytest.raises(TypeError, match=r"metric 'acc' \(function\) needs `update\(preds, targets\)`, `compute\(\)`"):
        MetricsCB(acc=lambda p, y: (p.argmax(1) == y).float().mean())


# ---------------------------------------------------------------- 9. cancel exceptions raised where nothing catches them

@pytest.mark.parametrize('event, exc, where', [
    ('before_fit', CancelBatchException, 'from `before_batch` to `after_batch`'),
    ('after_dataloader', CancelBatchException, 'from `before_batch` to `after_batch`'),
    ('cleanup_batch', CancelBatchException, 'from `before_batch` to `after_batch`'),
    ('after_fit', CancelEpochException, 'from `before_train`/`before_validate` to `after_train`/`after_validate`'),
    ('before_batch', CancelBackwardException, 'in `before_backward`, `backward` or `after_backward`'),
])
def test_a_cancel_raised_where_nothing_catches_it_is_an_error_naming_it(event, exc, where):
    seen = []
    class OnExc(Callback):
        def on_exception(self, t, exception): seen.append(exception)
    trainer = make_trainer([Raise(event, exc), OnExc()])
    with pytest.raises(RuntimeError) as info: trainer.fit(1)
    msg = str(info.value)
    assert f'{exc.__name__} was raised in Raise.{event}, where nothing catches it' in msg and f'it can be raised {where}' in msg
    assert 'raise CancelFitException' in msg and isinstance(info.value.__cause__, exc) and seen == [info.value]

def test_cancel_fit_in_cleanup_fit_just_ends_the_fit():
    make_trainer([Raise('cleanup_fit', CancelFitException)]).fit(1)


# ---------------------------------------------------------------- 10. obscure errors made clear

@pytest.mark.parametrize('kw, msg', [(dict(loss_func=nn.MSELoss), '`loss_func` is the class MSELoss: pass an instance, `MSELoss()`'),
                                     (dict(model=nn.Linear), '`model` is the class Linear: pass an instance, `Linear()`')])
def test_classes_instead_of_instances(kw, msg):
    args = dict(dls=make_dls(), loss_func=nn.MSELoss(), opt_func=torch.optim.SGD, model=nn.Linear(2, 1)) | kw
    with pytest.raises(TypeError) as info: Trainer(**args)
    assert msg in str(info.value)

@pytest.mark.parametrize('args, kw, exc, msg', [
    ((torch.zeros(4),), dict(bs=0), ValueError, 'a whole number of 1 or more (got 0)'),
    ((torch.zeros(4),), dict(bs=-3), ValueError, '(got -3)'),
    ((torch.zeros(4),), dict(bs=2.5), ValueError, '(got 2.5)'),
    ((np.zeros(4), np.zeros(4)), {}, TypeError, "got ['ndarray', 'ndarray']: convert NumPy arrays with `torch.from_numpy(a)`"),
    ((torch.tensor(1.),), {}, TypeError, 'torch tensors with a first dimension'),
])
def test_tensor_loader_arguments(args, kw, exc, msg):
    with pytest.raises(exc) as info: TensorLoader(*args, **kw)
    assert msg in str(info.value)


# ---------------------------------------------------------------- 11. the tensor cache never serves wrong data

@pytest.fixture
def fake(tmp_path, monkeypatch):
    from test_data import write_fake_fashion
    monkeypatch.setenv('AISAAC_CACHE', str(tmp_path/'cache'))
    monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
    src = tmp_path/'fake'; src.mkdir()
    write_fake_fashion(src, n_train=20, n_test=10)
    data._converted.clear()
    return src

def test_an_edit_to_a_transform_in_a_users_module_is_not_served_from_the_cache(fake, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path/'my_tfms.py').write_text("from aisaac.data import pil_to_tensor\ndef tfm(b): return {**b, 'image': [pil_to_tensor(o) for o in b['image']]}\n")
    import my_tfms
    x1 = to_tensors(load_fashion_mnist(fake)['train'].with_transform(my_tfms.tfm))[0]
    (tmp_path/'my_tfms.py').write_text("from aisaac.data import pil_to_tensor\ndef tfm(b): return {**b, 'image': [pil_to_tensor(o) * 0 for o in b['image']]}\n")
    importlib.reload(my_tfms)
    data._converted.clear()  # a new process
    x2 = to_tensors(load_fashion_mnist(fake)['train'].with_transform(my_tfms.tfm))[0]
    assert x1.abs().sum() > 0 and x2.abs().sum() == 0

def test_cached_tensors_that_do_not_match_the_split_are_rebuilt(fake):
    ds = load_fashion_mnist(fake)['test']
    x, y = to_tensors(ds)
    [fn] = (Path(data.cache_dir())/'tensors').glob('*.pt')
    torch.save([x[:5], y[:5]], fn)  # a file with too few rows under the right name
    data._converted.clear()
    with pytest.warns(UserWarning, match='does not match the split'): x2, y2 = to_tensors(ds)
    assert x2.shape == (10, 1, 28, 28) and torch.equal(x2, x)
    torch.save([x.double(), y], fn)  # the wrong dtype
    data._converted.clear()
    with pytest.warns(UserWarning, match='does not match the split'): assert to_tensors(ds)[0].dtype == torch.float32

@pytest.mark.parametrize('shuffle', [False, True])
def test_batches_are_never_views_of_the_stored_tensors(shuffle):
    x = torch.arange(12.).reshape(6, 2); keep = x.clone()
    for xb, in TensorLoader(x, bs=4, shuffle=shuffle, tfm=lambda b: (b[0].mul_(0),)): pass
    assert torch.equal(x, keep)

def test_an_in_place_change_to_a_batch_keeps_the_validation_data(fake):
    dls = DataLoaders.from_dataset_dict(load_fashion_mnist(fake), 4, fast=True)
    before = dls.valid.tensors[0].clone()
    class Scale(Callback):
        def before_batch(self, t): t.batch[0].mul_(0)
    torch.manual_seed(0)
    Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, nn.Sequential(nn.Flatten(), nn.Linear(784, 10)),
            callbacks=[BasicTrainCB(), Scale()]).fit(1)
    assert torch.equal(dls.valid.tensors[0], before)

def test_an_unreadable_dataset_cache_falls_back_to_the_idx_files(fake):
    load_fashion_mnist(fake)
    [folder] = [p for p in data.cache_dir().iterdir() if p.name.startswith('fashion_mnist-')]
    for f in folder.rglob('*.arrow'): f.write_bytes(b'garbage')
    data._loaded.clear()
    with pytest.warns(UserWarning, match=f'Delete the folder {folder}'): dsd = load_fashion_mnist(fake)
    assert {k: len(v) for k, v in dsd.items()} == {'train': 20, 'test': 10} and dsd['train'][3]['label'] == 3

def test_a_dataset_cache_of_other_data_falls_back_to_the_idx_files(fake, tmp_path):
    from test_data import write_fake_fashion
    load_fashion_mnist(fake)
    [folder] = [p for p in data.cache_dir().iterdir() if p.name.startswith('fashion_mnist-')]
    import shutil; shutil.rmtree(folder)
    other = tmp_path/'other'; other.mkdir(); write_fake_fashion(other, n_train=5, n_test=3)
    data._save_quietly(data.idx_dataset_dict(data.find_idx(other)), folder)  # a good cache of other data, under this key
    data._loaded.clear()
    with pytest.warns(UserWarning, match='does not match the IDX files'): dsd = load_fashion_mnist(fake)
    assert len(dsd['train']) == 20

def idx_bytes(arr):
    return struct.pack('>HBB', 0, 0x08, arr.ndim) + struct.pack(f'>{arr.ndim}I', *arr.shape) + arr.tobytes()

@pytest.mark.parametrize('raw, msg', [(b'', 'is not an IDX file (it is empty)'), (b'\0\0', 'is not an IDX file'),
                                      (idx_bytes(np.zeros((2, 3), np.uint8))[:-2], 'is truncated: 16 bytes where its header announces 18'),
                                      (idx_bytes(np.zeros((2, 3), np.uint8)) + b'xx', 'is damaged: 20 bytes'),
                                      (b'hello world', 'is not an IDX file'),
                                      (gzip.compress(idx_bytes(np.zeros((2, 3), np.uint8)), mtime=0)[:-4], 'is a damaged gzip file')])
def test_bad_idx_files_are_errors_naming_the_file_and_the_fix(tmp_path, raw, msg):
    (fn := tmp_path/'train-images-idx3-ubyte').write_bytes(raw)
    with pytest.raises(ValueError) as info: read_idx(fn)
    assert str(fn) in str(info.value) and msg in str(info.value) and 'get the file again' in str(info.value)

@pytest.mark.parametrize('imgs, lbls, msg', [(np.zeros((3, 28, 28), np.uint8), np.zeros(2, np.uint8), 'holds 3 images but'),
                                             (np.zeros((2, 28, 28), np.uint8), np.array([0, 12], np.uint8), 'labels outside 0..9'),
                                             (np.zeros((2, 784), np.uint8), np.zeros(2, np.uint8), 'not images (N, 28, 28)')])
def test_idx_files_that_disagree_are_an_error_naming_them(tmp_path, imgs, lbls, msg):
    (i := tmp_path/'i-idx3-ubyte').write_bytes(idx_bytes(imgs)); (l := tmp_path/'l-idx1-ubyte').write_bytes(idx_bytes(lbls))
    with pytest.raises(ValueError) as info: data.idx_dataset_dict({'train': (i, l)})
    assert msg in str(info.value) and 'do not belong together' in str(info.value)


# ---------------------------------------------------------------- 12. issue 15 items in these files

def test_one_batch_cb_lets_every_after_batch_see_the_batch():
    class Late(Callback):
        order = 500
        n = 0
        def after_batch(self, t): self.n += 1
    late = Late()
    trainer = make_trainer()
    trainer.fit(3, callbacks=[OneBatchCB(), late])
    assert late.n == 1 and trainer.epoch == 0 and OneBatchCB.order == 100

def test_the_validation_batch_size_is_twice_the_training_one(fake):
    dsd = load_fashion_mnist(fake)
    for fast in (False, True):
        dls = DataLoaders.from_dataset_dict(dsd, 3, fast=fast)
        assert (dls.train.batch_size, dls.valid.batch_size, len(dls.valid)) == (3, 6, 2)
    assert DataLoaders.from_dataset_dict(dsd, 3, valid_batch_size=10).valid.batch_size == 10
