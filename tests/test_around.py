"An `around_` hook that fails on its way out: the phase's cleanup knows it (issue 37)."
import pytest
import torch
from aisaac.core.callback import Callback
from tiny import make_trainer

class Outcomes(Callback):
    "Records the outcome each `cleanup_batch` and `cleanup_fit` sees"
    order = 5
    def __init__(self): self.seen = []
    def cleanup_batch(self, trainer): self.seen.append(('batch', trainer.outcome))
    def cleanup_fit(self, trainer): self.seen.append(('fit', trainer.outcome))

class FailsOnExit(Callback):
    "An `around_batch` hook that raises `exc` after its `yield` at the second batch"
    def __init__(self, exc): self.exc, self.n = exc, 0
    def around_batch(self, trainer):
        self.n += 1
        yield
        if self.n == 2: raise self.exc

def test_cleanup_batch_sees_the_error_an_around_hook_raised_on_its_way_out():
    seen = Outcomes()
    t = make_trainer([FailsOnExit(ValueError('flushing the profiler failed')), seen], n_train=(3, 3, 3))
    with pytest.raises(ValueError, match='flushing the profiler failed') as e: t.fit(1, valid=False)
    assert seen.seen == [('batch', 'ok'), ('batch', 'error'), ('fit', 'error')]
    assert t.exception is e.value and any('FailsOnExit.around_batch' in n for n in e.value.__notes__)

def test_an_ignored_failure_on_the_way_out_leaves_the_batch_ok():
    seen, cb = Outcomes(), FailsOnExit(ValueError('ignored'))
    cb.on_error = 'ignore'
    make_trainer([cb, seen], n_train=(3, 3, 3)).fit(1, valid=False)
    assert seen.seen == [('batch', 'ok')] * 3 + [('fit', 'ok')]
