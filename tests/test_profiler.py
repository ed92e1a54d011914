"TorchProfilerCB: a torch.profiler trace that names each callback's handlers, over the schedule's active steps only, one file per process; the profiler stopped however the fit ends."
import json
from pathlib import Path
import pytest, torch
from torch import nn
from torcheval.metrics import MulticlassAccuracy
from aisaac.core.callback import Callback
from aisaac.data import TensorLoader
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.gradients import GradAccumCB
from aisaac.callbacks.introspect import ProfileCB, TorchProfilerCB
import torchrun_cases

HERE = Path(__file__).parent

def make():
    "A classifier with 8 training batches and 2 validation batches, and `MetricsCB`"
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    dls = type('DLs', (), {'train': TensorLoader(x, y, bs=8), 'valid': TensorLoader(x[:16], y[:16], bs=8)})()
    torch.manual_seed(0)
    return Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, nn.Linear(4, 3), callbacks=[BasicTrainCB(), MetricsCB(Accuracy=MulticlassAccuracy())])

def names(path):
    "The names of the trace's complete events (ops, and the labels `record_function` put)"
    return [e['name'] for e in json.loads(Path(path).read_text())['traceEvents'] if e.get('ph') == 'X']

def profiler_off(): return not torch.autograd.profiler._is_profiler_enabled

def test_the_trace_names_each_callback_s_handlers_over_the_active_steps_only(tmp_path):
    t = make()
    p = TorchProfilerCB(tmp_path, wait=2, warmup=1, active=3, row_limit=5)
    t.fit(1, callbacks=p)
    assert [f.name for f in p.paths] == ['rank0.step6.pt.trace.json']  # written when step 5, the last active one, ended
    ns = names(p.paths[0])
    assert sorted(n for n in ns if n.startswith('ProfilerStep#')) == ['ProfilerStep#3', 'ProfilerStep#4', 'ProfilerStep#5']
    assert ns.count('MetricsCB.after_batch') == 3 and ns.count('BasicTrainCB.backward') == 3  # batches 3, 4, 5: not the others
    assert ns.count('phase:batch') == 3 and 'aten::addmm' in ns  # the loop's phase, and the ops inside it
    assert 'BasicTrainCB.backward' in p.table and profiler_off() and t._tracer is None

def test_steps_counted_in_optimizer_steps(tmp_path):
    "`per='step'`: a profiler step is an optimizer step applied, here 2 batches under `GradAccumCB(2)`"
    t = make()
    p = TorchProfilerCB(tmp_path, wait=1, warmup=1, active=2, per='step', row_limit=0)
    t.fit(1, callbacks=[p, GradAccumCB(2)])
    ns = names(p.paths[0])
    assert ns.count('BasicTrainCB.backward') == 4 and ns.count('BasicTrainCB.step') == 2  # batches 4 to 7: steps 2 and 3
    with pytest.raises(ValueError, match="'batch' or 'step'"): TorchProfilerCB(per='epoch')

def test_the_profiler_is_stopped_after_a_failed_fit(tmp_path):
    class Fail(Callback):
        def after_batch(self, t):
            if t.model.training and t.batch_num == 4: raise RuntimeError('boom')
    t = make()
    p = TorchProfilerCB(tmp_path, wait=1, warmup=1, active=5, row_limit=0)
    with pytest.raises(RuntimeError, match='boom'): t.fit(1, callbacks=[p, Fail()])
    assert profiler_off() and t._tracer is None and not hasattr(t, 'TorchProfilerCB')
    ns = names(p.paths[0])  # the cycle cut short is written: batches 2, 3 and the failed 4, then step 5, the cleanups until the stop
    assert sorted(n for n in ns if n.startswith('ProfilerStep#')) == [f'ProfilerStep#{i}' for i in (2, 3, 4, 5)]
    assert ns.count('phase:batch') == 3 and ns.count('Fail.after_batch') == 3
    t.fit(1, callbacks=TorchProfilerCB(tmp_path/'again', wait=0, warmup=1, active=1, row_limit=0))  # a profiler starts again
    assert profiler_off()

def test_no_trace_when_the_fit_is_shorter_than_the_schedule(tmp_path):
    t = make()
    p = TorchProfilerCB(tmp_path, wait=20, warmup=1, active=1)
    with pytest.warns(UserWarning, match='no step was recorded'): t.fit(1, callbacks=p)
    assert p.paths == [] and profiler_off()

def test_with_profile_cb_both_see_every_handler(tmp_path):
    "Two traces at once (`ProfileCB` times the handlers, `TorchProfilerCB` labels them): each sees them all"
    t = make()
    pc, tp = ProfileCB(), TorchProfilerCB(tmp_path, wait=0, warmup=1, active=2, row_limit=0)
    t.fit(1, callbacks=[pc, tp])
    calls = {(e, c): n for e, c, n, s, share in pc.stats}
    assert calls['backward', 'BasicTrainCB'] == 8 and calls['after_batch', 'MetricsCB'] == 10
    assert names(tp.paths[0]).count('BasicTrainCB.backward') == 2

TORCHRUN_CASES = HERE/'profiler_run.py', {'fit': ['fit']}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/profiler_run.py, run in one torchrun launch with the other cases the selected tests use (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

@torchrun_cases.uses('fit')
def test_one_trace_per_process(cases):
    "2 gloo processes (torchrun): each writes its own trace, named by its rank"
    r0, r1 = cases('fit')
    assert (r0['rank'], r1['rank']) == (0, 1)
    assert [Path(p).name for p in r0['paths']] == ['rank0.step4.pt.trace.json']
    assert [Path(p).name for p in r1['paths']] == ['rank1.step4.pt.trace.json']
    for r in (r0, r1): assert names(r['paths'][0]).count('MetricsCB.after_batch') == 2
