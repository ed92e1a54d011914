"""The plans of a set of callbacks: kept for when the same set comes back (every fit adds and removes callbacks), and traced on demand: `trace()` records every event and times every handler."""
__all__ = ['Trace', 'Plans']
import contextlib, functools, time
from .overview import CallbackSummary

class Trace:
    "What `trace` records: `events` (every dispatched event, in order) and `calls` (`(event, callback, seconds)` per handler)"
    def __init__(self): self.events, self.calls = [], []

    def wrap(self, owner, # the trainer (or other `CallbackMixin`) whose plan is made
             event:str, # the event's name
             handlers:list): # the event's `(callback, function, event)`, in order
        "`handlers` timed, after one that records `event`"
        def record(o, **kwargs): self.events.append(event)
        record.hidden = True  # the trace's own: no step handler
        return [(None, record, event)] + [(cb, f if ev.startswith('around_') else self._timed(f, ev, owner.name_of(cb)), ev)
                                          for cb, f, ev in handlers]

    def _timed(self, f, event, name):
        @functools.wraps(f)  # the same signature: it is given the arguments `f` names
        def timed(o, **kwargs):
            start = time.perf_counter()
            try: return f(o, **kwargs)
            finally: self.calls.append((event, name, time.perf_counter() - start))
        return timed

    def table(self):
        "The calls as a table: event, callback, time"
        return CallbackSummary((e, n, '', f'{s*1e6:.1f} us') for e, n, s in self.calls)
    def __repr__(self): return repr(self.table())
    def _repr_markdown_(self): return self.table()._repr_markdown_()

class Plans:
    "A `CallbackMixin` layer at its `callbacks_changed` and `handlers` seams: the plans of a set of callbacks are kept for when it comes back, and traced on demand"
    _tracer, kept = None, 4  # how many sets of callbacks keep their plans
    def callbacks_changed(self):
        "Sort the callbacks again, and take the plans made for this set of them, if it was seen lately; while tracing, traced plans afresh"
        super().callbacks_changed()
        if self._tracer is not None: return  # (the kernel's `plans` are new: the traced ones go there, and are not kept)
        sets = self.__dict__.setdefault('_sets', {})
        key = tuple(map(id, self.cbs)), frozenset(self.off)
        self.plans = sets.pop(key, None) or self.plans
        sets[key] = self.plans
        if len(sets) > self.kept: del sets[next(iter(sets))]

    def handlers(self, event:str): # an event's name
        "The handlers of `event`; while tracing, timed, after one that records the event"
        hs = super().handlers(event)
        return hs if self._tracer is None else self._tracer.wrap(self, event, hs)

    @contextlib.contextmanager
    def trace(self):
        "Record every event dispatched inside the `with` block, and each handler's time"
        previous, self._tracer = self._tracer, Trace()
        self.callbacks_changed()
        try: yield self._tracer
        finally:
            self._tracer = previous
            self.callbacks_changed()

