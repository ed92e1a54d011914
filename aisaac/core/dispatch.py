"""`with_cbs`, which makes a method a phase that callbacks surround, and `CallbackMixin`, which gives a class callbacks: added, grouped, ordered and run."""
__all__ = ['with_cbs', 'CallbackMixin', 'Entry', 'listify', 'flatten', 'handler']
import collections, collections.abc, functools, inspect, itertools, weakref
from .callback import Callback, CancelException, setting

class _NoCancel(Exception): "Stands for 'no cancel exception': a phase without one"
def _watched(o, phase):
    "Whether `o` runs the events of `phase`: a `CallbackMixin` when a callback handles one of them; any object with `run_callbacks`"
    if isinstance(o, CallbackMixin): return bool(o.plans[phase.events] if phase.events in o.plans else o.dispatch(phase.events))
    if callable(getattr(o, 'run_callbacks', None)): return True
    raise TypeError(f"`with_cbs` needs an object with a `run_callbacks(event)` method, and {type(o).__name__} has none: subclass "
                    f"`CallbackMixin`, or write a `run_callbacks` method")

class with_cbs:
    "Make a method the phase `nm`: `before_{nm}`, the method, `after_{nm}`, then `cleanup_{nm}` however it ended; `exception` ends it early"
    def __init__(self, nm:str, # the phase's name
                 exception:type=None): # the `Cancel...Exception` that ends the phase early, without an error
        self.nm, self.exception = nm, exception or _NoCancel
        self.events = self.before, self.after, self.cleanup = f'before_{nm}', f'after_{nm}', f'cleanup_{nm}'
    def __call__(self, f):
        @functools.wraps(f)
        def phase(o, *args, **kwargs):
            watched = _watched(o, self)  # (a phase with no handler runs the method alone: most batches)
            try:
                if watched: o.run_callbacks(self.before)
                res = f(o, *args, **kwargs)
                if watched: o.run_callbacks(self.after)
                o.outcome, o.exception = 'ok', None
                return res
            except self.exception as e: o.outcome, o.exception = getattr(e, 'outcome', 'cancelled'), e
            except BaseException as e:
                o.outcome, o.exception = 'interrupted' if isinstance(e, KeyboardInterrupt) else 'error', e
                raise
            finally:
                if watched: o.run_callbacks(self.cleanup)
        phase.phase = self
        return phase

def listify(cbs):
    "The callbacks in `cbs`: none for `None`, the items of a list or another iterable, else `cbs` itself"
    if cbs is None: return []
    return list(cbs) if isinstance(cbs, collections.abc.Iterable) and not isinstance(cbs, (str, bytes, Callback)) else [cbs]

def flatten(cbs):
    "The callbacks in `cbs` and, depth first, the members of the groups among them (their `callbacks`)"
    res, todo = [], listify(cbs)[::-1]
    while todo:
        res.append(cb := todo.pop())
        todo += listify(setting(cb, 'callbacks'))[::-1]
    return res

def handler(cb, event:str):
    "The function of `cb` that handles `event`: its method of that name, or its catch-all `run_event`; `None` if neither"
    if callable(catch_all := getattr(cb, 'run_event', None)): return functools.partial(catch_all, event)
    return f if callable(f := getattr(cb, event, None)) else None

def _arg_names(f):
    "The keyword arguments `f` takes after the trainer: a set of names, or `None` for any (`**kwargs`)"
    if (res := _names.get(key := getattr(f, '__func__', f), False)) is False:  # `signature` is slow, and each fit makes new plans
        ps = list(inspect.signature(f).parameters.values())[1:]
        res = None if any(p.kind is p.VAR_KEYWORD for p in ps) else frozenset(p.name for p in ps)
        if inspect.isfunction(key): _names[key] = res
    return res
_names = weakref.WeakKeyDictionary()

Entry = collections.namedtuple('Entry', 'order tier seq name cb')  # sorted by `order`, then tier (0: core, 1: added), then as added

class CallbackMixin:
    "Gives a class callbacks: `add_callbacks` and `remove_callbacks`, and `run_callbacks`, which runs an event's handlers in order"
    def __new__(cls, *args, **kwargs):  # so that a subclass may add callbacks before `super().__init__()`, or never call it
        self = super().__new__(cls)
        self._entries, self._seq, self.off, self._kept = {}, itertools.count(), set(), {}
        self.callbacks_changed()
        return self

    def add_callbacks(self, callbacks, # a callback, a group, or a list of them
                      tier:int=1): # among callbacks of equal `order`, lower tiers run first; core callbacks have 0
        "Add `callbacks`, and the members of the groups among them; returns the callbacks added"
        added = []
        try:
            for cb in flatten(callbacks):
                self.check_callback(cb)
                name = self.free_name(type(cb).__name__)
                self._entries[id(cb)] = Entry(setting(cb, 'order'), 0 if setting(cb, 'core') else tier, next(self._seq), name, cb)
                setattr(self, name, cb)  # `trainer.MetricsCB`
                added.append(cb)
            self.callbacks_changed()
        except Exception:
            self.remove_callbacks(added)  # all or nothing
            raise
        return added

    def check_callback(self, cb):
        "Refuse `cb` before it is added: one added already (layers check more, e.g. the names of its hooks)"
        if id(cb) in self._entries: raise ValueError(f"{cb!r} was added already: create a new instance to add it twice")

    def free_name(self, name:str): # a callback's class name
        "The name a callback of class `name` gets on this object: `name`, or `name_1`, `name_2`... when taken"
        taken = {e.name for e in self._entries.values()}
        return next(n for i in itertools.count() if (n := f'{name}_{i}' if i else name) not in taken)

    def remove_callbacks(self, callbacks): # a callback, a group, or a list of them
        "Remove `callbacks`, and the members of the groups among them"
        for cb in flatten(callbacks):
            if (e := self._entries.pop(id(cb), None)) is not None: delattr(self, e.name)
        self.callbacks_changed()

    def entry(self, cb): return self._entries.get(id(cb))  # `cb`'s `Entry` here, or `None`
    def name_of(self, cb): return e.name if (e := self.entry(cb)) else type(self if cb is None else cb).__name__  # `MetricsCB_1`
    def entries(self):
        "The `Entry` of every callback that runs here: those added (layers add others, e.g. global callbacks)"
        return list(self._entries.values())

    def callbacks_changed(self):
        "Sort the callbacks (`order`, then tier, then as added; layers apply declared relations) and take the plans of this set of callbacks"
        self.cbs = [e.cb for e in sorted(self.entries(), key=lambda e: e[:3])]
        key = tuple(map(id, self.cbs)), frozenset(self.off)  # a fit adds and removes callbacks: the plans of a set that comes back are kept
        self.plans = self._kept.pop(key, None) or {}
        self._kept[key] = self.plans
        if len(self._kept) > 4: del self._kept[next(iter(self._kept))]

    def switch_off(self, cbs): # callbacks
        "Switch `cbs` off until `switch_on`: their handlers do not run"
        self.off.update(map(id, cbs))
        self.callbacks_changed()

    def switch_on(self):
        "Switch every callback on again"
        if self.off: self.off.clear(); self.callbacks_changed()

    def handlers(self, event:str):
        "`(callback, function, event)` of each handler of `event`, in run order (layers add others, e.g. the class's own)"
        return [(cb, f, event) for cb in self.cbs if id(cb) not in self.off and (f := handler(cb, event)) is not None]

    def dispatch(self, events):
        "The plan of `events` (a name, or names run in turn): `(callback, function, its argument names, event)` of each handler, made once"
        key = events if isinstance(events, (str, tuple)) else tuple(events)
        if (plan := self.plans.get(key)) is None:
            plan = self.plans[key] = tuple((cb, f, _arg_names(f), ev) for e in ((key,) if isinstance(key, str) else key)
                                           for cb, f, ev in self.handlers(e))
        return plan

    def run_callbacks(self, events, # an event's name, or a list of names run in turn
                      **kwargs): # for the handlers that name them
        "Run the handlers of `events` in order, each with the `kwargs` it names; after a failure, `cleanup_` and `on_exception` run the rest"
        try: plan = self.plans[events]  # (the plan is looked up for every event of every batch)
        except (KeyError, TypeError): plan = self.dispatch(events)
        if not plan: return
        failed, off = None, self.off
        for cb, f, names, event in plan:
            if off and id(cb) in off: continue  # switched off while this event ran (by an `around_` hook)
            try: f(self, **(kwargs if names is None else {k: v for k, v in kwargs.items() if k in names})) if kwargs else f(self)
            except Exception as e:  # the one place a handler's failure is decided: it goes on up, unless a layer handles it
                if not self.must_raise(e, cb, event): continue
                if not (event.startswith('cleanup_') or event == 'on_exception'): raise
                if failed is None or isinstance(failed, CancelException): failed = e  # the first error, else the first cancel
        if failed is not None: raise failed

    def must_raise(self, e:Exception, # what a handler raised
                   cb, event:str): # the handler's callback (`None`: the class's own) and event
        "Whether `e` goes on up: always, here (layers apply the callback's `on_error`, note where it was raised, agree across processes)"
        return True

    def has_handlers(self, event:str): return bool(self.dispatch(event))  # whether any callback handles `event` now
