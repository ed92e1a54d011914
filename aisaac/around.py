"""`around_` hooks: a callback's generator that wraps a phase, set up before its first `before_` handler and torn down before its `cleanup_` handlers."""
__all__ = ['AroundHooks']
import inspect, weakref

def _named(around):
    "A handler of an `around` hook whose failures say so (`e.hook`): the error policy names the hook, not the event it runs in"
    def deco(f):
        def handler(owner):
            try: return f(owner)
            except BaseException as e:
                if not hasattr(e, 'hook'): e.hook = around
                raise
        handler.hidden = True  # shown as the callback's `around_` hook, not among the event's handlers
        return handler
    return deco

_open = weakref.WeakKeyDictionary()  # owner -> {(callback id, hook): the hook's generators that are open}

class AroundHooks:
    "A `CallbackMixin` layer at its `handlers` seam: each `around_{phase}` generator is entered first in `before_{phase}`, exited first in `cleanup_{phase}`"
    def handlers(self, event:str):
        "The handlers of `event`, with those that enter (in `before_`) or exit (in `cleanup_`) the `around_` hooks of its phase first"
        hs = super().handlers(event)
        if event.startswith('before_'): around = 'around_' + event[7:]
        elif event.startswith('cleanup_'): around = 'around_' + event[8:]
        else: return hs
        if event[0] == 'b':
            return [(cb, self._enter(f, cb, around), event) for cb in self.cbs if id(cb) not in self.off
                    and callable(f := getattr(cb, around, None))] + hs
        exits = [(cb, self._exit(cb, around), event) for cb in self.cbs if callable(getattr(cb, around, None))]  # those switched off too
        return exits[::-1] + hs

    def _enter(self, f, cb, around):
        "The handler that starts `cb`'s `around` generator and keeps it until the phase's cleanup"
        @_named(around)
        def enter(owner):
            gen = f(owner)
            if not inspect.isgenerator(gen): raise TypeError(f"{self.name_of(cb)}.{around} must be a generator that yields once")
            try: next(gen)
            except StopIteration:
                raise RuntimeError(f"{self.name_of(cb)}.{around} returned without yielding: an around_ hook must yield exactly once") from None
            _open.setdefault(owner, {}).setdefault((id(cb), around), []).append(gen)
        return enter

    def _exit(self, cb, around):
        "The handler that ends `cb`'s open `around` generator: it resumes after its `yield`, or gets the error or cancel that ended the phase"
        @_named(around)
        def exit(owner):
            if not (open_ := _open.get(owner, {}).get((id(cb), around))): return  # it never started
            gen, err, name = open_.pop(), None if owner.outcome == 'ok' else owner.exception, f"{self.name_of(cb)}.{around}"
            try:
                if err is None: next(gen)
                else: gen.throw(err)
            except StopIteration:
                if err is None: return
                raise RuntimeError(f"{name} swallowed {type(err).__name__}: an around_ hook must let exceptions through (use `try: yield` / "
                                   f"`finally:`); to end a phase early, raise its Cancel exception") from None
            except BaseException as e:
                if e is not err: raise  # else it went through, as it should
            else:
                gen.close()
                raise RuntimeError(f"{name} yielded more than once: an around_ hook must yield exactly once")
        return exit
