"""Argument and result rewriting (ArgumentRewriting's callbacks): in a phase whose method takes arguments, a `before_` handler that names some gets them and returns replacements; an `after_` handler that names `return_value` gets the result and may return another."""
__all__ = ['ArgumentRewriting', 'rewriting']
import functools, inspect, weakref
from .core.dispatch import with_cbs

_RAN, _calls = object(), weakref.WeakKeyDictionary()  # owner -> its phases that rewrite, running

class _Call:
    "A call of a phase that rewrites: the phase, its bound arguments, and its result once the method returned"
    def __init__(self, ph, bound): self.ph, self.bound, self.result = ph, bound, None

def rewriting(phase): # a method made a phase by `with_cbs`, that takes arguments
    "`phase`, whose `before_` handlers may replace its arguments and `after_` handlers its result"
    f, ph = phase.__wrapped__, phase.phase
    sig = inspect.signature(f)
    @with_cbs(ph.nm, ph.exception)
    def inner(o):  # the method, on the arguments as the `before_` handlers left them
        call = _calls[o][-1]
        call.result = f(o, *call.bound.args[1:], **call.bound.kwargs)
        return _RAN
    @functools.wraps(f)
    def rewrites(o, *args, **kwargs):
        if not o.rewriters(ph): return phase(o, *args, **kwargs)  # no handler names the arguments or the result
        bound = sig.bind(o, *args, **kwargs)
        bound.apply_defaults()
        calls = _calls.setdefault(o, [])
        calls.append(call := _Call(ph, bound))
        try: return call.result if inner(o) is _RAN else None  # `None` when the phase was cancelled
        finally: calls.pop()
    rewrites.phase, rewrites.params = ph, tuple(sig.parameters)[1:]
    return rewrites

class ArgumentRewriting:
    "A `CallbackMixin` layer: the phases of a subclass's methods with arguments rewrite them (`rewriting`), through the `handlers` seam"
    rewrites = {}  # event -> the arguments its handlers may name: `before_{phase}`: the method's, `after_{phase}`: `return_value`
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.rewrites = dict(cls.rewrites)
        for name in dir(cls):
            f = inspect.getattr_static(cls, name, None)
            if not isinstance(getattr(f, 'phase', None), with_cbs): continue
            if not hasattr(f, 'params'):
                if len(inspect.signature(f.__wrapped__).parameters) < 2: continue  # no arguments to rewrite
                setattr(cls, name, f := rewriting(f))
            cls.rewrites.update({f.phase.before: f.params, f.phase.after: ('return_value',)})

    def rewriters(self, ph:with_cbs): # a phase
        "Whether a handler of `ph` names its arguments (in `before_`) or its result (in `after_`): then the phase rewrites"
        return any(getattr(f, 'rewrites', False) for e in (ph.before, ph.after) for _, f, _, _ in self.dispatch(e))

    def handlers(self, event:str):
        "The handlers of `event`; in a phase that rewrites, those that name its arguments (or result) get them and give replacements"
        hs = super().handlers(event)
        if (params := self.rewrites.get(event)) is None: return hs
        return [(cb, _rewriter(f, params, event) if _takes(f, params) else f, ev) for cb, f, ev in hs]

def _names(f):
    "The names `f` takes after the object, or `None` for any (`**kwargs`)"
    ps = list(inspect.signature(f).parameters.values())[1:]
    return None if any(p.kind is p.VAR_KEYWORD for p in ps) else {p.name for p in ps}

def _takes(f, params):
    "Whether the handler `f` names one of `params` (or takes any keyword); remembered per function: plans are made at every fit"
    key = getattr(f, '__func__', f)
    if (res := (known := _taking.get(key, {})).get(params)) is None:
        res = (names := _names(f)) is None or bool(names & set(params))
        if inspect.isfunction(key): _taking[key] = known | {params: res}
    return res
_taking = weakref.WeakKeyDictionary()  # function -> {arguments: whether it takes one}

def _rewriter(f, params, event):
    "The handler `f` of `event`, given the arguments (or `return_value`) it names from the call, its non-`None` result replacing them"
    names = _names(f)
    named = [] if names is None else [p for p in params if p in names]
    def rewriter(o):
        calls = _calls.get(o)
        if not calls or event not in (calls[-1].ph.before, calls[-1].ph.after):  # added while the phase ran (by a constructor)
            return f(o, **({'return_value': None} if params == ('return_value',) and (names is None or 'return_value' in names) else {}))
        call = calls[-1]
        values = {'return_value': call.result} if params == ('return_value',) else call.bound.arguments
        res = f(o, **({k: values[k] for k in named} if names is not None else {k: v for k, v in values.items() if k in params}))
        if res is None or not named: return
        if params == ('return_value',): call.result = res
        else: call.bound.arguments.update(zip(named, res if len(named) > 1 else [res]))
    rewriter.rewrites, rewriter.func = True, getattr(f, 'func', f)  # (`func`: what `summarize_callbacks` shows)
    return rewriter
