"""Seeing the callbacks: `summarize_callbacks` (which run at each event, in which order, doing what), `plan` (the order resolved and why, and who provides what each needs), `show_training_loop` (the loop as pseudocode, with the callbacks at each event) and `view_source_code`."""
__all__ = ['CallbackSummary', 'CallbackPlan', 'Overview', 'view_source_code']
import inspect
from .depends import relations, need_report

class CallbackSummary(list):
    "Rows of (event, callback, order, what it does); shows as a table"
    headers = ('event', 'callback', 'order', 'does')
    empty = 'no handler'
    def __repr__(self):
        if not self: return f'({self.empty})'
        rows = [self.headers] + [tuple(map(str, r)) for r in self]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.headers))]
        return '\n'.join('  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
    def _repr_markdown_(self):
        if not self: return f'({self.empty})'
        rows = ['| ' + ' | '.join(self.headers) + ' |', '|' + ' --- |' * len(self.headers)]
        return '\n'.join(rows + ['| ' + ' | '.join(str(c).replace('|', '\\|') for c in r) + ' |' for r in self])

class _Needs(CallbackSummary): headers, empty = ('callback', 'needs', 'provided by'), 'no callback declares a need'

class CallbackPlan(CallbackSummary):
    "Rows of (event, position, callback, order, why it runs there), then `needs`: rows of (callback, need, provided by); shows as tables"
    headers = ('event', '#', 'callback', 'order', 'why here')
    def __init__(self, rows=(), # (event, position, callback, order, why) rows
                 needs=()): # (callback, need, provided by) rows
        super().__init__(rows); self.needs = _Needs(needs)
    def __repr__(self): return super().__repr__() + (f'\n\n{self.needs!r}' if self.needs else '')
    def _repr_markdown_(self): return super()._repr_markdown_() + (f'\n\n{self.needs._repr_markdown_()}' if self.needs else '')

def _doc(f, cb):
    doc = inspect.getdoc(f) or (inspect.getdoc(type(cb)) if cb is not None else '') or ''
    return doc.splitlines()[0] if doc else ''

_loop = '''fit: before_fit
  for each epoch:
    training pass: before_train, before_epoch
      for each batch: before_dataloader, after_dataloader
        one_batch: before_batch
          predict: before_predict, predict, after_predict
          loss: before_loss, get_loss, after_loss
          backward: before_backward, backward, after_backward
          step: before_step, step, after_step (applied) or step_skipped
          zero_grad: before_zero_grad, zero_grad, after_zero_grad
        end of batch: after_batch, cleanup_batch, checkpoint
      end of pass: after_epoch, cleanup_epoch, after_train, cleanup_train
    validation pass: before_validate, before_epoch
      for each batch: before_dataloader, after_dataloader
        one_batch: before_batch, before_predict, predict, after_predict, before_loss, get_loss, after_loss, after_batch, cleanup_batch
      end of pass: after_epoch, cleanup_epoch, after_validate, cleanup_validate
    end of epoch: checkpoint
  end of fit: after_fit, cleanup_fit; on_exception if it failed'''

class Overview:
    "A `CallbackMixin` layer: tables of the callbacks at each event (`summarize_callbacks`, `plan`) and the loop with them (`show_training_loop`)"
    def _events(self):
        "The events that may have handlers, in the order they fire: the class's `events`, then its callbacks' own"
        known = [e for c in reversed(type(self).__mro__) for e in vars(c).get('events', ())]
        known = list(dict.fromkeys(known))
        return known + sorted({n for cb in self.cbs for n in dir(cb) if not n.startswith('_') and n not in known
                               and (n.startswith(('before_', 'after_', 'cleanup_')) or n in getattr(cb, 'custom_events', ()))})

    def _shown(self, event):
        "The handlers of `event` a reader should see: the callbacks', the class's declared ones and its own steps (not its hidden)"
        return [(cb, f) for cb, f, ev in self.handlers(event) if ev == event and not getattr(f, 'hidden', False)]

    def summarize_callbacks(self):
        "A table of every event that has handlers, in the order the loop fires them, with the callbacks that run, in their order"
        res = CallbackSummary()
        for event in self._events():  # the class's own handlers (declared callbacks, a subclass's steps) show with no order
            res += [(event, self.name_of(cb), '' if cb is None else getattr(cb, 'order', 0), _doc(getattr(f, 'func', f), cb))
                    for cb, f in self._shown(event)]
        return res

    def plan(self):
        "Every event's handlers in run order, with why each runs where it does (a declared relation, its `order`, core first, as added), and who provides what each callback needs"
        cbs, names = self.active()
        rels, res = relations(cbs), CallbackPlan()
        for event in self._events():
            prev = _START
            for k, (cb, _) in enumerate(self._shown(event), 1):
                res.append((event, k, self.name_of(cb), '' if cb is None else getattr(cb, 'order', 0), self._why(prev, cb, cbs, rels)))
                prev = cb
        res.needs.extend((n, need, 'nobody' if who == [] else ', '.join(who) if who else 'unverified: a callback without `provides` may')
                         for n, need, who in need_report(self, cbs, names))
        return res

    def _why(self, prev, cb, cbs, rels):
        "Why `cb` runs right after `prev` in an event"
        if cb is None: return "the class's own handler"
        if prev is _START: return 'first'
        if prev is None: return "after the class's own handler"
        i, j = cbs.index(prev), cbs.index(cb)
        if (w := [w for a, b, w in rels if (a, b) == (i, j)]): return w[0]
        ea, eb = self.entry(prev), self.entry(cb)
        if (ea.order, ea.tier, ea.seq) > (eb.order, eb.tier, eb.seq): return 'moved by the declared relations'
        if ea.order != eb.order: return f'order {ea.order} < {eb.order}'
        if ea.tier != eb.tier: return 'same order: core callbacks first' if ea.tier == 0 else "same order: the trainer's callbacks before global ones"
        return 'same order: added later'

    def show_training_loop(self):
        "Print the training loop as indented pseudocode, with the callbacks that run at each of its events, in their order"
        out = []
        for line in _loop.splitlines():
            what, _, events = line.partition(': ')
            out.append(what + ':')
            pad = ' ' * (len(what) - len(what.lstrip()) + 2)
            for ev in (e.strip().split(' ')[0] for e in events.replace(';', ',').split(',')):
                names = [self.name_of(cb) for cb, _ in self._shown(ev)]
                out.append(f"{pad}{ev:<17} {', '.join(names) if names else '-'}")
        print('\n'.join(out))

_START = object()

def view_source_code(obj): # a class, function or method
    "Show the source code of `obj` (a class, function or method), highlighted in a notebook"
    src = inspect.getsource(obj)
    try:
        from IPython import get_ipython
        from IPython.display import Code, display
        if get_ipython() is not None: return display(Code(src, language='python'))
    except ImportError: pass
    print(src)
