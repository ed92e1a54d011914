"""The guards: a callback that could not work is refused when it is added (a misspelled hook is named, with the event it was meant to be), and a fit that could not work is refused before anything changes, each error naming its cause and its fix."""
__all__ = ['closest', 'class_events', 'check_callback', 'CallbackGuards', 'TrainerGuards']
import collections.abc, difflib, inspect, math, numbers, warnings
import torch
from .core.callback import Callback, CancelException, CancelBatchException, CancelEpochException, CancelBackwardException, CancelStepException
from .core.dispatch import CallbackMixin, listify
from .core import trainer as kernel
from .depends import _subclasses

def closest(name:str, known): # a name, and the names it may be a misspelling of
    "The name in `known` that `name` most likely misspells, or `None`: the one 'did you mean' of aisaac"
    near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.85 if len(name) <= 7 else 0.8)
    return near[0] if near else None

def class_events(cls):
    "The events objects of `cls` fire: the `events` of its classes, its phases' (`with_cbs`) and their `around_` ones"
    events = {e for c in cls.__mro__ for e in vars(c).get('events', ())}
    for c in cls.__mro__:
        for f in vars(c).values():
            if (ph := getattr(f, 'phase', None)) is not None and hasattr(ph, 'before'): events |= {ph.before, ph.after, ph.cleanup}
    return events | {'around_' + e[7:] for e in events if e.startswith('before_')}

_not_hooks = {'run_event', 'state_dict', 'load_state_dict', 'callbacks', 'custom_events', 'on_error', 'order', 'core'}

def _check_hooks(cb, known, foreign):
    "Raise if `cb` has a method that looks like an event in `known` (or another library's hook, in `foreign`) but is none"
    cls = type(cb).__name__
    for name in dir(type(cb)):
        f = getattr(type(cb), name, None)
        if name.startswith('around_') and inspect.isfunction(f) and not inspect.isgeneratorfunction(f):
            raise TypeError(f"{cls}.{name} must be a generator that yields once (`...set up...; yield; ...tear down...`), "
                            f"or it cannot wrap the phase")
    if not known or callable(getattr(cb, 'run_event', None)): return
    known = known | set(getattr(cb, 'custom_events', ()))
    for name in dir(type(cb)):
        if name.startswith('_') or name in known or name in _not_hooks or not callable(getattr(cb, name, None)): continue
        if name in foreign:
            raise AttributeError(f"{cls}.{name} is another library's hook name, so it would never run here: "
                                 f"aisaac calls it {foreign[name]}. If it is an event of your own, list it in `{cls}.custom_events`.")
        near = closest(name, known) if len(name) >= 5 else None
        if near or name.startswith(('before_', 'after_', 'cleanup_', 'around_')):
            raise AttributeError(f"{cls}.{name} is not an event, so it would never run: did you mean "
                                 f"{near or difflib.get_close_matches(name, list(known), n=1, cutoff=0)[0]!r}? "
                                 f"If it is an event of your own, list it in `{cls}.custom_events`.")

def check_callback(cb, owner=None): # a callback; the object it is added to (`None`: a global callback, for every object)
    "Refuse `cb` when it is no callback, declares a setting aisaac cannot honour, or has a hook that would never run"
    if isinstance(cb, type): raise TypeError(f"{cb.__name__} is a class, not a callback: pass an instance, e.g. `{cb.__name__}()`")
    if cb is None or isinstance(cb, (str, bytes, int, float)):
        raise TypeError(f"{cb!r} is not a callback: pass objects with hook methods such as `before_batch`")
    if isinstance(cb, (list, tuple, set, frozenset, collections.abc.Mapping, collections.abc.Iterator)):
        raise TypeError(f"A {type(cb).__name__} among the callbacks is no callback: pass one flat list (e.g. `[*these, *those]`), "
                        f"or make a group, an object whose `callbacks` attribute lists its members")
    if (policy := getattr(cb, 'on_error', 'raise')) not in ('raise', 'warn', 'ignore'):
        raise ValueError(f"{type(cb).__name__}.on_error is {policy!r}, which is no error policy: use 'raise' (the default), 'warn' or 'ignore'")
    if (role := getattr(cb, 'runs_on', 'all')) not in ('all', 'main', 'collective'):
        raise ValueError(f"{type(cb).__name__}.runs_on is {role!r}: use 'all' (every process, the default), 'main' (the main process only) "
                         f"or 'collective' (every process, at the same point)")
    if role == 'collective' and policy != 'raise':
        raise ValueError(f"{type(cb).__name__} is collective (runs_on='collective'), so its on_error must be 'raise': switched off on one "
                         f"process after an error, it would leave the others waiting for it")
    classes = [type(owner)] if owner is not None else _subclasses(CallbackMixin)
    known = set().union(*map(class_events, classes))
    _check_hooks(cb, known, {k: v for c in classes for k, v in getattr(c, 'foreign_hooks', {}).items()})

def _members(cb):
    "The members of the group `cb` (its `callbacks`), as a list; refused when they have no order or would be used up"
    ms = getattr(cb, 'callbacks', None)
    if isinstance(ms, collections.abc.Iterator):  # a generator would be used up by adding the group, and removing it would find no members
        raise TypeError(f"{type(cb).__name__}.callbacks is a one-shot iterator: make it a list, e.g. `self.callbacks = [...]`")
    return _ordered(ms, f'{type(cb).__name__}.callbacks')

def _ordered(o, what='callbacks'):
    "The callbacks in `o`, as `listify` reads them; a set or a dict, which has no order, is refused"
    if isinstance(o, (set, frozenset, collections.abc.Mapping)):
        kind = 'dict' if isinstance(o, collections.abc.Mapping) else 'set'
        raise TypeError(f"{what} is a {kind}, which has no order, and callbacks of equal `order` run in the order given: "
                        f"pass a list instead" + (" (`list(d.values())`)" if kind == 'dict' else ''))
    return listify(o)

def _check_groups(callbacks):
    "Refuse callbacks with no order, and a group that contains itself (which would never end)"
    path, on_path, todo = [], set(), [iter(callbacks)]  # no recursion: groups may nest deeper than Python's recursion limit
    while todo:
        if (c := next(todo[-1], _DONE)) is _DONE:
            todo.pop()
            if path: on_path.discard(id(path.pop()))
            continue
        if id(c) in on_path:
            cycle = path[next(i for i, p in enumerate(path) if p is c):] + [c]
            raise ValueError(f"The callback group {type(c).__name__} contains itself ({' -> '.join(type(p).__name__ for p in cycle)}): "
                             f"remove it from its members' `callbacks`")
        path.append(c); on_path.add(id(c)); todo.append(iter(_members(c)))

_DONE = object()

class CallbackGuards:
    "A `CallbackMixin` layer: callbacks that cannot work are refused when added (`add_callbacks`, `check_callback`), the name of the fix given"
    runtime_attrs = ()  # attributes the object sets while it runs: no callback may take their name
    def add_callbacks(self, callbacks, # a callback, a group, or a list of them
                      tier:int=1): # among callbacks of equal `order`, lower tiers run first; core callbacks have 0
        "Add `callbacks`, refusing a collection without order and a group that contains itself"
        _check_groups(callbacks := _ordered(callbacks))  # (read once: a generator can be read only once)
        return super().add_callbacks(callbacks, tier)

    def check_callback(self, cb):
        "Refuse `cb` when it is no callback, has a hook that would never run, or would take the name of an attribute"
        check_callback(cb, self)
        super().check_callback(cb)
        name = self.free_name(type(cb).__name__)
        if name in type(self).runtime_attrs:
            raise ValueError(f"A callback class named {name!r} would be reached as `{type(self).__name__.lower()}.{name}`, which the "
                             f"{type(self).__name__} overwrites while it runs: rename the class, e.g. {name.title().replace('_', '')}CB")
        if hasattr(type(self), name) or name in self.__dict__:
            raise ValueError(f"A callback named {name!r} would hide the attribute {type(self).__name__}.{name}: rename the callback class")

_steps_do = {'predict': ('no predictions would be made', 'run the model twice'), 'get_loss': ('no loss would be computed', 'compute the loss twice'),
             'backward': ('no gradients would be computed, so the weights would never change', 'compute the gradients twice'),
             'step': ('the weights would never change', 'step the optimizer twice per batch')}
_cancel_scope = {CancelBatchException: 'from `before_batch` to `after_batch` (the events of the batch phase)',
                 CancelEpochException: 'from `before_train`/`before_validate` to `after_train`/`after_validate`',
                 CancelBackwardException: 'in `before_backward`, `backward` or `after_backward`',
                 CancelStepException: 'from `before_step` to `after_zero_grad`'}

def _own(cb, f): return cb is None and not getattr(f, 'hidden', False)  # the class's own handler of a step

def _is_number(s):
    try: return isinstance(s, str) and math.isfinite(float(s))
    except ValueError: return False

class TrainerGuards:
    "A `Trainer` layer: bad arguments, a missing or doubled step, an empty loader and a non-finite loss are errors that name the fix"
    required_events = ('predict', 'get_loss', 'backward', 'step')  # with no handler, the step raises when it would run
    nonfinite_loss = 'raise'  # a NaN or infinite training loss at the end of a training pass: 'raise', 'warn', or None to go on
    fitting = False
    def __init__(self, dls, loss_func, opt_func=torch.optim.SGD, model=None, callbacks=None):
        if not (hasattr(dls, 'train') and hasattr(dls, 'valid')):
            raise TypeError(f"`dls` must have `train` and `valid` loaders (got {type(dls).__name__}): use `DataLoaders(train_dl, valid_dl)`")
        for name, o in (('loss_func', loss_func), ('model', model)):
            if isinstance(o, type): raise TypeError(f"`{name}` is the class {o.__name__}: pass an instance, `{o.__name__}()`")
        if loss_func is not None and not callable(loss_func):
            raise TypeError(f"`loss_func` must be callable (got {loss_func!r}): pass e.g. `nn.CrossEntropyLoss()` or `F.cross_entropy`, "
                            f"or None for a model that computes its own loss (a Hugging Face model given `labels`)")
        if isinstance(opt_func, torch.optim.Optimizer) or not callable(opt_func):
            raise TypeError(f"`opt_func` must make an optimizer from parameters and a learning rate (got {opt_func!r}): pass the class, e.g. `torch.optim.Adam`")
        if not isinstance(model, torch.nn.Module): raise TypeError(f"`model` must be a `torch.nn.Module` (got {type(model).__name__})")
        super().__init__(dls, loss_func, opt_func, model, callbacks)

    def check_fit(self, n_epochs, # the fit's number of epochs
                  lr, # its learning rate
                  train, # whether it trains
                  valid, # whether it validates
                  **options): # the options of the layers
        "Refuse, before anything changes, a fit that would do nothing, or not what was asked"
        if self.fitting:
            raise RuntimeError("fit() was called while this trainer is fitting (from one of its callbacks?): it would replace the running fit's "
                               "epochs, learning rate and optimizer. Call it after the fit returns, or fit another Trainer.")
        if isinstance(n_epochs, bool) or not isinstance(n_epochs, numbers.Integral) or n_epochs < 1:
            raise ValueError(f"`n_epochs` must be a whole number of epochs, 1 or more (got {n_epochs!r})")
        if isinstance(lr, torch.Tensor) and lr.numel() == 1: lr = lr.item()
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not math.isfinite(lr) or lr < 0:
            raise ValueError(f"`lr` must be a finite number, 0 or more (got {lr!r})" + (f": pass `lr={float(lr)}`" if _is_number(lr) else ''))
        for name, on in (('train', train), ('valid', valid)):
            if not isinstance(on, bool): raise TypeError(f"`{name}` must be True or False (got {on!r})")
            dl = getattr(self.dls, name)
            if on and not isinstance(dl, collections.abc.Iterable):
                raise TypeError(f"`dls.{name}` is {'None' if dl is None else 'not iterable: ' + type(dl).__name__}: give the DataLoaders a {name} "
                                f"loader, or call `fit({name}=False)`")
        if not (train or valid): raise ValueError("`fit(train=False, valid=False)` would run nothing: leave one of them True")
        super().check_fit(n_epochs=n_epochs, lr=lr, train=train, valid=valid, **options)

    def start_fit(self, **args): # `fit`'s arguments
        "Refuse a fit in which two callbacks would both do `backward` or `step`; from here on, the trainer is fitting"
        self._check_steps(args['train'])
        super().start_fit(**args)
        self.fitting = True

    def end_fit(self):
        "The fit is over"
        self.fitting = False
        super().end_fit()

    def fit_error(self, e:BaseException):
        "A cancel exception that no phase caught is an error that says where it can be raised"
        if not isinstance(e, CancelException): return super().fit_error(e)
        scope = next((v for k, v in _cancel_scope.items() if isinstance(e, k)), 'inside the phase it cancels')
        return super().fit_error(RuntimeError(f"{type(e).__name__} was raised in {getattr(e, 'raised_in', 'a callback')}, where nothing catches "
                                              f"it: it can be raised {scope}. To stop the whole fit from anywhere, raise CancelFitException."))

    def one_pass(self, training:bool): # the training pass (`True`) or the validation pass
        "One pass; after a training pass, a non-finite loss is an error (or a warning: `nonfinite_loss`)"
        super().one_pass(training)
        if training and self.nonfinite_loss: self._check_loss()

    def handlers(self, event:str):
        "The handlers of `event`; a step nothing handles raises when it would run, and a pass with no batch is an error"
        hs = super().handlers(event)
        if event == 'after_epoch' and type(self)._batches is kernel.Trainer._batches: return [(None, _no_batches, event)] + hs  # its loop
        if event in self.required_events and not any(_own(cb, f) or callable(getattr(cb, event, None)) for cb, f, _ in hs):
            return [(None, self._missing(event), event)]  # (a catch-all's `run_event` is no handler of its own)
        return hs

    def _missing(self, event):
        "What stands in for the step `event` when nothing handles it: it raises when the step would run (a fit that stops before runs fine)"
        def missing(trainer):
            raise RuntimeError(f"Nothing handles `{event}` in this fit, so {_steps_do[event][0]}: add `BasicTrainCB()` (or `CoreCBs()`, which "
                               f"has it), or a callback or {type(trainer).__name__} method named `{event}`")
        return missing

    def _check_steps(self, train):
        "Refuse a fit in which two core callbacks (or the trainer's own method and a core callback) would both do `backward` or `step`"
        cls = type(self)
        if not train or cls.one_batch is not kernel.Trainer.one_batch or cls._batches is not kernel.Trainer._batches: return  # its own loop
        for event in ('backward', 'step'):
            names = [self.name_of(cb) for cb, f, _, _ in self.dispatch(event) if _own(cb, f) or getattr(cb, 'core', False)]
            if len(names) > 1:  # (a callback that only watches is no core one)
                raise RuntimeError(f"`{event}` has {len(names)} handlers ({', '.join(f'{n}.{event}' for n in names)}), so each batch would "
                                   f"{_steps_do[event][1]}: keep one (to change one step of BasicTrainCB, subclass it and override that method)")

    def _check_loss(self):
        "Raise (or warn) if the last training loss of the pass is NaN or infinite: one read of the loss per pass, no host sync per batch"
        if (loss := getattr(self, 'loss', None)) is None: return
        v = loss.detach() if isinstance(loss, torch.Tensor) else torch.as_tensor(loss)
        if bool(torch.isfinite(v).all()): return
        msg = (f"The training loss is {v.tolist()} at the end of epoch {self.epoch}'s training pass (it is checked once per epoch, "
               f"after {self.batch_num} batches; it went non-finite at one of them), so the weights have probably become NaN or inf too. "
               f"Lower the learning rate, look for NaN or inf in the data, or clip the gradients; add TerminateOnNaNCB to stop at the first such "
               f"batch. To go on anyway, set `trainer.nonfinite_loss = 'warn'` (or None).")
        if self.nonfinite_loss == 'warn': warnings.warn(msg)
        else: raise FloatingPointError(msg)

def _no_batches(trainer):
    "A pass that got no batch from its loader would do nothing: an error that says why"
    if trainer.batch_num: return
    which = 'train' if trainer.model.training else 'valid'
    dl = getattr(trainer.dls, which)
    why = ("it is an iterator (a generator?), used up by an earlier pass: pass a list, a torch DataLoader or a TensorLoader, which start again "
           "every epoch") if isinstance(dl, collections.abc.Iterator) else \
          "it is empty (an empty dataset? `drop_last=True` with fewer rows than the batch size?)"
    raise ValueError(f"`dls.{which}` gave no batch in epoch {trainer.epoch}, so this pass would do nothing: {why}")

_no_batches.hidden = True  # the trainer's own check: not shown among the callbacks
