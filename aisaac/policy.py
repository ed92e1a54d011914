"""The error policy: a handler's failure raises, warns or is ignored, as its callback's `on_error` says, and an error names where it was raised."""
__all__ = ['ErrorPolicy', 'also_raised']
import os, traceback, warnings
from .core.callback import CancelException, setting

def also_raised(e:BaseException): # an exception raised while another was on its way out
    "The note that says `e` was raised too, where, and in which handler"
    tb = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    at = f" ({os.path.basename(tb[0].filename)}:{tb[0].lineno})" if tb else ''
    notes = [n for n in getattr(e, '__notes__', ()) if n.startswith('raised in callback ')]
    return f"also raised on the way out: {type(e).__name__}: {e}{at}" + (f", {notes[-1]}" if notes else '')

class ErrorPolicy:
    "A `CallbackMixin` layer at its seam for failures, `must_raise`: each callback's `on_error`, and notes that say where an error was raised"
    setup_events = ()  # events where a callback with `must_start` set ends the run whatever its `on_error` (the `Trainer`: `before_fit`)
    def must_raise(self, e:Exception, # what the handler raised
                   cb, event:str): # the handler's callback (`None`: the class's own handler) and event
        "Apply `cb`'s `on_error` to `e`: `False` when it is handled (warned about or ignored); an error that goes on up names the handler"
        hook = getattr(e, 'hook', event)  # an `around_` hook runs in its phase's `before_` and `cleanup_` events, and is named
        if isinstance(e, CancelException):  # no error: remember who cancelled, for the message if it escapes its phase
            if not hasattr(e, 'raised_in'): e.raised_in = f'{self.name_of(cb)}.{hook}'
        else:
            policy = 'raise' if setting(cb, 'must_start') and event in self.setup_events else setting(cb, 'on_error')
            if policy == 'ignore': return False
            if policy == 'warn':
                warnings.warn(f"{self.where(cb, hook)} raised {type(e).__name__}: {e}; the callback is disabled for the rest of this fit "
                              f"(its on_error is 'warn')")
                self.switch_off([cb])
                return False
            e.add_note(f"raised in callback {self.where(cb, hook)}")
        if (err := self.unwinding(event)) is not None and err is not e:  # a cleanup failed while an error goes out: that error wins
            err.add_note(also_raised(e))
            return False
        return super().must_raise(e, cb, event)

    def where(self, cb, event:str):
        "The handler, its order, epoch and batch, as in `MetricsCB.after_batch (order 0), epoch 1, batch 3`"
        return (f"{self.name_of(cb)}.{event} (order {setting(cb, 'order')}), epoch {getattr(self, 'epoch', None)}, "
                f"batch {getattr(self, 'batch_num', None)}")

    def unwinding(self, event:str):
        "The error on its way out while `event` runs, when it is a `cleanup_` event or `on_exception`; else `None`"
        if event == 'on_exception': return self.exception
        return self.exception if event.startswith('cleanup_') and getattr(self, 'outcome', None) in ('error', 'interrupted') else None
