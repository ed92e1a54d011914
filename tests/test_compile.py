"CompileCB (with the quick `eager` backend; bench/compile.py and the notebook's slow cell use inductor): the compiled model trains, the original comes back."
import pytest
import torch
from torch import nn

from aisaac.core.callback import Callback
from aisaac.callbacks.compilation import CompileCB
from aisaac.callbacks.devices import MoveModulesToDeviceCB
from tiny import make_trainer

class Seen(Callback):
    def before_fit(self, t): self.models = set()
    def predict(self, t): self.models.add(type(t.model).__name__)

def test_the_compiled_model_trains_the_original_parameters_and_the_original_comes_back():
    seen = Seen()
    torch.manual_seed(0); model = nn.Linear(2, 1)
    t = make_trainer([CompileCB(backend='eager'), seen], model=model)
    t.fit(2, lr=0.1)
    torch.manual_seed(0)
    ref = make_trainer([], model=nn.Linear(2, 1))
    ref.fit(2, lr=0.1)
    assert seen.models == {'OptimizedModule'} and t.model is model
    assert torch.equal(model.weight, ref.model.weight) and torch.equal(model.bias, ref.model.bias)
    assert list(t.model.state_dict()) == ['weight', 'bias']  # no `_orig_mod.` prefix to save

def test_a_second_fit_reuses_the_compiled_model_a_new_model_is_compiled_again():
    cb = CompileCB(backend='eager')
    t = make_trainer([cb])
    t.fit(1); first = cb.compiled
    t.fit(1); assert cb.compiled is first
    t.model = nn.Linear(2, 1)
    t.fit(1); assert cb.compiled is not first and cb.compiled._orig_mod is t.model

def test_the_original_comes_back_when_the_fit_fails():
    class Boom(Callback):
        def after_loss(self, t): raise RuntimeError('boom')
    model = nn.Linear(2, 1)
    t = make_trainer([CompileCB(backend='eager'), Boom()], model=model)
    with pytest.raises(RuntimeError, match='boom'): t.fit(1)
    assert t.model is model and t.CompileCB.module is None

def test_other_modules_move_but_not_the_compiled_model():
    class Rec(nn.Module):
        def __init__(self): super().__init__(); self.calls = 0
        def to(self, *a, **k): self.calls += 1; return self
    t = make_trainer([CompileCB(backend='eager'), MoveModulesToDeviceCB()])
    t.extra = Rec()
    t.fit(1)
    assert t.extra.calls == 1 and t.MoveModulesToDeviceCB.moved == ['loss_func', 'extra']

def test_unknown_keyword():
    with pytest.raises(TypeError, match="fulgraph.*torch.compile"): CompileCB(fulgraph=True)
    CompileCB(mode='reduce-overhead', fullgraph=True, dynamic=False, backend='eager', options=None)
