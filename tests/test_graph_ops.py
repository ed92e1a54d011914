"""The kernels of `CUDAGraphCB`'s captured step against the hand-written step's (issue 48), counted on the CPU: every aten op that
launches a kernel (views, allocations and the profiler's markers left out) while the step is captured, with `EagerGraphs` (whose capture
runs the step) under a `TorchDispatchMode`. The hand-written step is PyTorch's whole-network capture recipe: the gradients set to `None`
before the capture, forward, loss, backward, (clipping,) `opt.step()`, no zeroing in the graph, with the same optimizer (the trainer's
parameter groups, its capturable or fused step, a tensor learning rate), so that what differs is what aisaac adds.

Before (commit 9a6b195) and after, kernels of the captured training step, hand-written vs aisaac:

| model (the recipe's optimizer)                         | hand | aisaac before       | aisaac after |
|--------------------------------------------------------|------|---------------------|--------------|
| MLP 20-64-10, SGD (fused)                              |   15 | 26 (+11)            | 17 (+2)      |
| the vision tutorial's ResNet, AdamW, bfloat16 autocast |  749 | 854 (+105)          | 751 (+2)     |
| the LM tutorial's GPT 4x192, fused AdamW, bf16, clip   |  457 | 513 (+56)           | 459 (+2)     |

Before, each trainable parameter cost two kernels more: its gradient zeroed in place inside the graph (`zero_`), and the backward adding into
that zeroed tensor (`add_`) instead of writing it; and the loss's record took three (`clamp`, `index_copy_`, `add_`). Now a graph whose step
begins with no gradient makes them (the backward writes them, `zero_grad` lets them go), and the loss's record takes two (`index_copy_` into
the slot the count points at, the count's `add_`). An accumulation window that spans replays keeps the gradients across them: its stepping
graph zeroes them with one `torch._foreach_zero_`."""
import collections, functools
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.callbacks.gradients import GradAccumCB, GradClipCB
from aisaac.callbacks.schedule import OneCycleSchedulerCB, WarmupCosineSchedulerCB
from aisaac.callbacks.graphs import CUDAGraphCB
from aisaac.callbacks.graphplan import EagerGraphs
from aisaac.models import get_model_gpt, get_model_resnet, lm_loss

_NO_KERNEL = {torch.ops.aten.empty, torch.ops.aten.empty_strided, torch.ops.aten.empty_like, torch.ops.aten.new_empty,
              torch.ops.aten.new_empty_strided, torch.ops.aten._local_scalar_dense}

def launches_kernel(func):
    "Whether an aten op runs a kernel: not a view (an aliasing output that is not written), an allocation or a profiler marker"
    if func.namespace == 'profiler' or func.overloadpacket in _NO_KERNEL: return False
    r = func._schema.returns
    return not (r and r[0].alias_info is not None and not r[0].alias_info.is_write)

class Kernels(TorchDispatchMode):
    "Count the ops that run a kernel, by name, in the block"
    def __init__(self): super().__init__(); self.ops = collections.Counter()
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches_kernel(func): self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))
    @property
    def n(self): return sum(self.ops.values())

class CountingGraphs(EagerGraphs):
    "`EagerGraphs` that counts the kernels of each capture (its run of the step), with whether it was a training step"
    def __init__(self, trainer_model=None): self.captures = []
    def capture(self, step):
        with Kernels() as k: g = super().capture(step)
        self.captures.append(k)
        return g

def _mlp():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64 * 8, 20, generator=g), torch.randint(0, 10, (64 * 8,), generator=g)
    return dict(model=lambda: nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10)), x=x, y=y, bs=64, loss=nn.CrossEntropyLoss(),
                opt=torch.optim.SGD, lr=0.01, cbs=lambda: [], amp=None, clip=None)

def _resnet():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16 * 8, 1, 28, 28, generator=g), torch.randint(0, 10, (16 * 8,), generator=g)
    return dict(model=lambda: get_model_resnet().to(memory_format=torch.channels_last), x=x, y=y, bs=16, loss=nn.CrossEntropyLoss(),
                opt=torch.optim.AdamW, lr=0.01, cbs=lambda: [OneCycleSchedulerCB(cycle_momentum=False), MixedPrecisionCB(torch.bfloat16)],
                amp=torch.bfloat16, clip=None)

def _gpt():
    tokens = torch.randint(0, 2048, (4 * 8, 17), generator=torch.Generator().manual_seed(0))
    return dict(model=lambda: get_model_gpt(2048, n_layer=4, n_head=4, d_model=192, block_size=128, dropout=0.1), x=tokens[:, :-1], y=tokens[:, 1:],
                bs=4, loss=lm_loss, opt=functools.partial(torch.optim.AdamW, fused=True), lr=2e-3,
                cbs=lambda: [WarmupCosineSchedulerCB(warmup=100), GradClipCB(1.0), MixedPrecisionCB(torch.bfloat16)], amp=torch.bfloat16, clip=1.0)

RECIPES = {'MLP 20-64-10, SGD': _mlp, "the vision tutorial's ResNet, AdamW, bfloat16": _resnet,
           "the LM tutorial's GPT 4x192, fused AdamW, bfloat16, clipping": _gpt}

def aisaac_step(r, *extra, n_captures=1):
    "The kernels of aisaac's captured training steps (one fit's), and its optimizer's groups (their parameters by position, their settings)"
    torch.manual_seed(0)
    back = CountingGraphs()
    dl = TensorLoader(r['x'], r['y'], bs=r['bs'], shuffle=True, seed=0, drop_last=True)
    t = Trainer(DataLoaders(dl, dl), r['loss'], r['opt'], r['model'](),
                callbacks=[BasicTrainCB(), MetricsCB(show=False), *r['cbs'](), *extra, CUDAGraphCB(backend=back)])
    t.fit(1, lr=r['lr'], valid=False)
    assert t.CUDAGraphCB.counts['captured'] == n_captures and t.CUDAGraphCB.why_eager is None, (t.CUDAGraphCB.counts, t.CUDAGraphCB.why_eager)
    pos = {id(p): i for i, p in enumerate(t.model.parameters())}
    groups = [{k: v for k, v in g.items() if k not in ('params', 'lr', 'initial_lr', 'max_lr', 'min_lr', 'base_lr')} | {'at': [pos[id(p)] for p in g['params']]}
              for g in t.opt.param_groups]
    return back.captures, groups

def hand_step(r, groups, accumulate=False):
    "The kernels of the step written by hand as PyTorch's capture recipe has it, with aisaac's optimizer groups; `accumulate`: a window's last batch (gradients there already, the loss halved)"
    torch.manual_seed(0)
    model = r['model']()
    ps = list(model.parameters())
    opt = r['opt']([{k: v for k, v in g.items() if k != 'at'} | {'params': [ps[i] for i in g['at']]} for g in groups], lr=r['lr'])
    for g in opt.param_groups: g['lr'] = torch.tensor(r['lr'])  # (read from a tensor, as in a graph)
    x, y = r['x'][:r['bs']].clone(), r['y'][:r['bs']].clone()
    def backward():
        with torch.autocast('cpu', r['amp'] or torch.bfloat16, enabled=r['amp'] is not None): loss = r['loss'](model(x), y)
        (loss / 2 if accumulate else loss).backward()
    def step():
        backward()
        if r['clip']: nn.utils.clip_grad_norm_(model.parameters(), r['clip'])
        opt.step()
    for _ in range(3): step(); opt.zero_grad(set_to_none=True)  # (warm-up: the optimizer's state made)
    if accumulate: backward()  # the window's first batch
    with Kernels() as k: step()
    return k

@pytest.mark.parametrize('recipe', RECIPES)
def test_the_captured_step_launches_no_more_kernels_than_the_hand_written_one(recipe):
    "At most 2 kernels more than the hand-written step (the loss's record, into the device buffer of losses), none zeroing a gradient"
    r = RECIPES[recipe]()
    (a,), groups = aisaac_step(r)
    h = hand_step(r, groups)
    print(f"{recipe}: hand {h.n}, aisaac {a.n}; more {dict(a.ops - h.ops)}, fewer {dict(h.ops - a.ops)}")
    assert a.n <= h.n + 2, (h.n, a.n, dict(a.ops - h.ops), dict(h.ops - a.ops))
    assert not a.ops['zero_'] and not a.ops['_foreach_zero_'] and a.ops - h.ops <= collections.Counter(index_copy_=1, add_=1), a.ops - h.ops

def test_an_accumulation_window_zeroes_its_gradients_with_one_kernel():
    "`GradAccumCB(2)`: the window's gradients live across replays, and its stepping graph zeroes them all with one `_foreach_zero_`: the hand-written accumulating step + 3"
    r = _mlp()
    (first, last), groups = aisaac_step(r, GradAccumCB(2), n_captures=2)  # the window's first batch (no step), then its last (the step)
    h = hand_step(r, groups, accumulate=True)
    assert last.ops['_foreach_zero_'] == 1 and not last.ops['zero_'] and not first.ops['_foreach_zero_'], (first.ops, last.ops)
    assert last.n <= h.n + 3, (h.n, last.n, dict(last.ops - h.ops), dict(h.ops - last.ops))
