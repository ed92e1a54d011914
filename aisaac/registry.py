"""Callbacks that apply to every trainer at once: `register_global_callback`, and any `Callback` as a context manager."""
__all__ = ['GlobalCallbacks', 'GlobalCallbackHandle', 'register_global_callback']
import itertools, weakref
from .core.callback import Callback, setting
from .core.dispatch import Entry, flatten
from .guards import check_callback

_global, _owners, _seq = {}, weakref.WeakSet(), itertools.count()  # id -> Entry of each global callback; the objects that run them

class GlobalCallbacks:
    "A `CallbackMixin` layer at its `entries` seam: the global callbacks run on every object with callbacks, after its own of equal order"
    def entries(self):
        "The callbacks added here, and the global ones"
        return super().entries() + list(_global.values())

    def callbacks_changed(self):
        "Sort the callbacks again; this object runs the global callbacks from now on"
        _owners.add(self)
        super().callbacks_changed()

    def entry(self, cb): return super().entry(cb) or _global.get(id(cb))  # `cb`'s `Entry`, added here or global

    def check_callback(self, cb):
        "Refuse a global callback, which runs here already"
        if id(cb) in _global:
            raise ValueError(f"{cb!r} is a global callback already, so it runs in every fit: do not add it to this {type(self).__name__} too "
                             f"(or add a new instance)")
        super().check_callback(cb)

class GlobalCallbackHandle:
    "What `register_global_callback` returns: `remove()` unregisters the callback"
    def __init__(self, cb): # the callback (or group) registered
        self.cb = cb
    def remove(self):
        "Unregister the callback (and the members of its group)"
        for cb in flatten(self.cb): _global.pop(id(cb), None)
        _changed()

def _changed():
    for owner in list(_owners): owner.callbacks_changed()

def register_global_callback(cb): # a callback or a group, for every object with callbacks
    "Make `cb` a callback of every trainer, after their own; returns a handle whose `remove()` unregisters it"
    members = flatten(cb)
    for c in members:
        check_callback(c)  # its hooks checked against the events of every class with callbacks
        if (owner := next((o for o in list(_owners) if o.entry(c) is not None), None)) is not None:
            raise ValueError(f"{c!r} is a callback of a {type(owner).__name__} already: a global callback runs in every fit, so remove it "
                             f"from there first (or register a new instance)")
    for c in members: _global[id(c)] = Entry(setting(c, 'order'), 2, next(_seq), type(c).__name__, c)
    _changed()
    return GlobalCallbackHandle(cb)

def _enter(self):
    "Register this callback globally for the `with` block"
    self._global_handle = register_global_callback(self)
    return self

def _exit(self, *exc_info):
    "Unregister this callback, whatever happened in the block"
    self._global_handle.remove()

Callback.__enter__, Callback.__exit__ = _enter, _exit  # `with CheckLoss(): trainer.fit()`
