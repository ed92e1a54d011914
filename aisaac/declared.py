"""Callbacks declared on a class (ArcticTraining's style): a `callbacks` list of `(event, function)` and methods named `{event}_callback`, inherited and chained parents first; a subclass's own steps; and the constructor as the `init` phase."""
__all__ = ['DeclaredCallbacks']
import functools, inspect
from .core.callback import setting
from .core.dispatch import with_cbs
from .compat import arctic_event
from .rewrite import rewriting

def _declared(cls):
    "The callbacks `cls` itself declares: its `callbacks` list, then its `*_callback` methods"
    own = [(arctic_event(ev), f) for ev, f in cls.__dict__.get('callbacks', ())]
    return own + [(name[:-len('_callback')], f) for name, f in cls.__dict__.items()
                  if callable(f) and name.startswith(('before_', 'after_')) and name.endswith('_callback')]

def _check_own_steps(cls):
    "Each method of `cls` named after one of its `own_events` must be callable with the object alone; other libraries' names are refused"
    for name, f in cls.__dict__.items():
        if name in getattr(cls, 'foreign_steps', {}) and callable(f):
            raise TypeError(f"{cls.__name__}.{name} is another library's name for a step, so it would never run here: "
                            f"name it {cls.foreign_steps[name]}, which runs as that step's handler")
        if name not in cls.own_events or not inspect.isfunction(f): continue
        if any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in list(inspect.signature(f).parameters.values())[1:]):
            raise TypeError(f"{cls.__name__}.{name} runs as the `{name}` step, called with the {cls.__name__} alone: give its other "
                            f"parameters defaults, or rename it if it is not that step (e.g. `get_preds` for a `predict` that takes data)")

def _init_phase(init):
    "`init` as the `init` phase, whose `before_init` handlers may replace its arguments; once per construction, however long the chain of `super().__init__`"
    phase = rewriting(with_cbs('init')(init))
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if self.__dict__.get('_constructing'): return init(self, *args, **kwargs)
        self._constructing = True
        try: phase(self, *args, **kwargs)
        finally: del self._constructing
    __init__.phase, __init__.params = phase.phase, phase.params
    return __init__

def _constructed(owner): "The object is made"
_constructed.hidden = True

class DeclaredCallbacks:
    "A `CallbackMixin` layer at its `handlers` seam: the class's declared callbacks run first, its own steps before the callbacks of order 0"
    class_callbacks = ()  # (event, function) of the class's declared callbacks, its parents' first
    own_events = ()       # events that a method of the class itself handles (the most derived one's), before the callbacks of order >= 0
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.class_callbacks = tuple(cls.class_callbacks) + tuple(_declared(cls))
        _check_own_steps(cls)
        if not hasattr(cls.__init__, 'params') and cls.__init__ is not object.__init__: cls.__init__ = _init_phase(cls.__init__)

    def handlers(self, event:str):
        "The handlers of `event`: the class's declared callbacks, then the callbacks', with the class's own step among them"
        hs = super().handlers(event)
        if event == 'cleanup_init': hs = [(None, _constructed, event)] + hs  # the `init` phase always runs its events (its callbacks come late)
        if event in self.own_events and callable(own := getattr(type(self), event, None)):
            hs.insert(next((i for i, (cb, _, _) in enumerate(hs) if setting(cb, 'order') >= 0), len(hs)), (None, own, event))
        return [(None, f, event) for ev, f in type(self).class_callbacks if ev == event] + hs
