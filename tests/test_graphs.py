"""`CUDAGraphCB` on the CPU: the fallback without a GPU, and, with `EagerGraphs` (whose replay runs the captured step again),
everything it does around its graphs: the learning rate in tensors under every scheduler, per group; the callbacks that keep a
fit eager, named when it starts; accumulation windows; the events of a replayed batch; shapes, unfreezing, checkpoints.
The same on a GPU, with real graphs, is in tests/test_cuda.py (marked `cuda`)."""
import contextlib, functools, warnings
from unittest import mock
import pytest
import torch
from torch import nn
from aisaac.core.callback import Callback, CancelBatchException, CancelStepException
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.schedule import (OneCycleSchedulerCB, WarmupCosineSchedulerCB, BatchSchedulerCB, EpochSchedulerCB,
                                       PlateauSchedulerCB)
from aisaac.callbacks.gradients import GradAccumCB, GradClipCB, MicroBatchCB
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.callbacks.stoppers import TerminateOnNaNCB
from aisaac.callbacks.hooks import ActivationStatsCB
from aisaac.callbacks.graphplan import EagerGraphs
from aisaac.callbacks.graphs import CUDAGraphCB, GraphWarning
from graph_fits import fit, make_trainer, tensor_dls, weights, mlp, Losses, StopAt

def graphed(**kwargs): return CUDAGraphCB(backend=EagerGraphs(), **kwargs)
def all_eager(**kwargs): return CUDAGraphCB(backend=EagerGraphs(), warmup=10**6, **kwargs)  # the same steps, never a graph

def two_groups(params, lr, opt=torch.optim.AdamW):
    "Two parameter groups, the second at a tenth of the rate"
    ps = list(params)
    return opt([{'params': ps[:2]}, {'params': ps[2:], 'lr': lr / 10}], lr=lr)

# ---------------------------------------------------------------------------------------------------------------------
# without a GPU

def test_on_the_cpu_it_says_once_why_and_trains_as_without_it():
    cb = CUDAGraphCB()
    with pytest.warns(GraphWarning, match='the model is on cpu, and CUDA graphs need a CUDA GPU: this fit runs eagerly'):
        t, w = fit(cb)
    assert torch.equal(w, fit()[1]) and cb.counts == {}
    assert t.opt.param_groups[0].get('capturable') is False  # the optimizer untouched
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        t.fit(1)  # said once: no warning the second time

# ---------------------------------------------------------------------------------------------------------------------
# the learning rate in tensors, with every scheduler

class SeenLR(Callback):
    "After each step: each group's float and the tensor the step read it from"
    cuda_graph = 'host'
    def before_fit(self, t): self.seen = []
    def after_step(self, t): self.seen.append([(g['lr'], t.CUDAGraphCB.lr_tensors[i].item()) for i, g in enumerate(t.opt.param_groups)])

SCHEDULERS = {'one cycle': lambda opt: OneCycleSchedulerCB(cycle_momentum=False),  # (its momentum, or Adam's beta1, cannot be a tensor)
              'warm-up and cosine': lambda opt: WarmupCosineSchedulerCB(warmup=5),
              'torch, per batch': lambda opt: BatchSchedulerCB(functools.partial(torch.optim.lr_scheduler.ExponentialLR, gamma=0.97)),
              'torch, per epoch': lambda opt: EpochSchedulerCB(functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)),
              'plateau': lambda opt: PlateauSchedulerCB(greater_is_better=True, patience=0, factor=0.5)}  # halves the rate each epoch

@pytest.mark.parametrize('opt', ['AdamW', 'SGD'])
@pytest.mark.parametrize('sched', SCHEDULERS)
def test_every_scheduler_moves_the_learning_rate_through_its_tensors_per_group(sched, opt):
    "The tensors hold each group's rate as the scheduler sets it; the weights are those of the same fit never replayed"
    kw = dict(opt_func=functools.partial(two_groups, opt=getattr(torch.optim, opt)), n_epochs=4)
    t, w = fit(SCHEDULERS[sched](opt), SeenLR(), graphed(), **kw)
    assert t.CUDAGraphCB.counts['replayed'] >= 20 and t.CUDAGraphCB.why_eager is None, (t.CUDAGraphCB.counts, t.CUDAGraphCB.why_eager)
    seen = t.SeenLR.seen
    assert len({round(f, 9) for s in seen for f, _ in s[:1]}) > 2  # the rate moved
    for s in seen:
        (f0, v0), (f1, v1) = s
        assert v0 == torch.tensor(f0).item() and v1 == torch.tensor(f1).item(), s  # each group's float, in float32
    _, w_eager = fit(SCHEDULERS[sched](opt), all_eager(), **kw)
    assert torch.equal(w, w_eager)
    _, w_plain = fit(SCHEDULERS[sched](opt), **kw)
    torch.testing.assert_close(w, w_plain, rtol=1e-4, atol=1e-5)  # the float32 rate, and SGD's fused step

@pytest.mark.parametrize('opt, what', [('SGD', '`momentum`'), ('AdamW', '`betas`')])
def test_a_scheduler_that_moves_what_a_graph_holds_fixed_makes_the_fit_eager(opt, what):
    "One cycle cycles SGD's momentum and Adam's beta1, which a graph cannot read from a tensor: said, with the fix, and the rest runs eagerly"
    opt_func = getattr(torch.optim, opt)
    with pytest.warns(GraphWarning, match=what + r" \(parameter group 0\) went from .*Pass `OneCycleSchedulerCB\(cycle_momentum=False\)`"):
        t, w = fit(OneCycleSchedulerCB(), graphed(), opt_func=opt_func)
    assert t.CUDAGraphCB.counts['captured'] == 0
    torch.testing.assert_close(w, fit(OneCycleSchedulerCB(), opt_func=opt_func)[1], rtol=1e-5, atol=1e-7)
    t, _ = fit(OneCycleSchedulerCB(cycle_momentum=False), graphed(), opt_func=opt_func)
    assert t.CUDAGraphCB.counts['captured'] > 0

# ---------------------------------------------------------------------------------------------------------------------
# the callbacks that keep a fit eager, named when it starts

class ReadsLoss(Callback):
    "Reads the loss's value after every batch: a host sync per batch on a GPU"
    cuda_graph = ('sync', "reads the loss's value every batch")
    def after_batch(self, t): self.last = t.loss.item()

class Undeclared(Callback):
    "Handles a step's event and says nothing of how"
    def after_loss(self, t): self.n = getattr(self, 'n', 0) + 1

class Batches(Callback):
    cuda_graph = 'host'
    def before_fit(self, t): self.n = 0
    def before_batch(self, t): self.n += 1

@pytest.mark.parametrize('cbs, named', [
    (lambda: [ReadsLoss()], "ReadsLoss reads the loss's value every batch"),
    (lambda: [TerminateOnNaNCB()], 'TerminateOnNaNCB reads the loss on the host after every batch'),
    (lambda: [Undeclared()], "Undeclared handles `after_loss`, and says nothing of how: declare `cuda_graph = 'capture'`"),
    (lambda: [MicroBatchCB(2)], 'MicroBatchCB runs the steps of each microbatch from its own handler'),
    (lambda: [MixedPrecisionCB(torch.float16)], 'MixedPrecisionCB uses float16, whose gradient scaler reads on the host'),
    (lambda: [ActivationStatsCB()], 'the model has hooks on Sequential, 0, 1 and more'),
])
def test_a_callback_that_keeps_the_fit_eager_is_named_at_its_start(cbs, named):
    "Named with the reason and what eager costs; the fit trains as without CUDAGraphCB. `strict=True` refuses it before any batch"
    with pytest.warns(GraphWarning, match='this fit runs eagerly, because') as rec:
        t, w = fit(*cbs(), graphed())
    msg = next(str(w.message) for w in rec if issubclass(w.category, GraphWarning))  # (MixedPrecisionCB's float16 on a CPU warns too)
    assert named in msg and 'several times a replay' in msg, msg
    assert t.CUDAGraphCB.counts == {}
    assert torch.equal(w, fit(*cbs())[1])
    batches = Batches()
    with pytest.raises(ValueError, match=r'CUDAGraphCB\(strict=True\) refuses this fit, which cannot be graphed: ' + named[:20]):
        fit(*cbs(), batches, graphed(strict=True))
    assert batches.n == 0

def test_an_undeclared_callback_outside_the_step_is_named_and_runs():
    class Watch(Callback):
        def before_fit(self, t): self.n = 0
        def after_batch(self, t): self.n += 1
    watch = Watch()
    cb = graphed()
    t, _ = fit(watch, cb)
    assert watch.n == 4 * (8 + 2) and cb.counts['replayed'] > 0
    assert any('Watch run in Python around each replay' in m for m in cb._said)

def test_a_callback_after_cuda_graph_cb_in_before_batch_keeps_it_eager():
    class Late(Callback):
        order = 20_000
        def before_batch(self, t): pass
    with pytest.warns(GraphWarning, match=r"Late changes the batch in `before_batch` after CUDAGraphCB has replayed it"):
        fit(Late(), graphed())

# ---------------------------------------------------------------------------------------------------------------------
# what a replayed batch computes, and its events

@pytest.mark.parametrize('extra', [
    lambda: [],
    lambda: [GradClipCB(0.5)],
    lambda: [GradAccumCB(3)],
    lambda: [MixedPrecisionCB(torch.bfloat16)],
    lambda: [WarmupCosineSchedulerCB(), GradAccumCB(2), GradClipCB(1.)],
])
def test_replayed_batches_compute_what_eager_batches_do(extra):
    "Weights, the losses MetricsCB keeps per batch, both passes' losses, the clock and the steps skipped by accumulation"
    losses, ref = Losses(), Losses()
    t, w = fit(*extra(), losses, graphed())
    t0, w0 = fit(*extra(), ref, all_eager())
    cb = t.CUDAGraphCB
    assert cb.counts['replayed'] > cb.counts['eager'] and cb.why_eager is None, cb.counts
    assert torch.equal(w, w0) and torch.equal(losses.values(), ref.values())
    assert t.history.get_metric_values('valid_loss') == t0.history.get_metric_values('valid_loss')
    assert t.history.get_metric_values('train_loss', per='batch') == t0.history.get_metric_values('train_loss', per='batch')
    assert (t.clock.step, t.clock.micro_step, t.clock.samples) == (t0.clock.step, t0.clock.micro_step, t0.clock.samples)

def test_accumulation_windows_skip_the_steps_they_always_skip():
    "GradAccumCB's windows: the batches of a window get a graph without a step, the last one a graph with it; `step_skipped` as eagerly"
    class Skips(Callback):
        cuda_graph = 'host'
        def before_fit(self, t): self.reasons = []
        def step_skipped(self, t, reason): self.reasons.append(reason)
    s, s0 = Skips(), Skips()
    t, _ = fit(GradAccumCB(4), s, graphed())
    fit(GradAccumCB(4), s0)
    assert s.reasons == s0.reasons and len(s.reasons) == 24 and t.CUDAGraphCB.counts['captured'] == 3  # no step, a step, validation

def test_a_step_skipped_in_a_batch_whose_graph_stepped_is_an_error():
    class Skip(Callback):
        cuda_graph = 'host'
        def before_step(self, t):
            if t.clock.micro_step == 6: raise CancelStepException('mine')
    with pytest.raises(RuntimeError, match=r"A callback skipped the optimizer step of a batch \(mine\) whose CUDA graph had already applied it"):
        fit(Skip(), graphed())

def test_a_batch_cancelled_after_its_replay_is_an_error_and_before_it_a_skip():
    def cancel(self, t):
        if t.training and t.clock.micro_step == 6: raise CancelBatchException()
    late = type('CancelsAfterLoss', (Callback,), {'cuda_graph': 'host', 'after_loss': cancel})()
    with pytest.raises(RuntimeError, match=r'CancelBatchException, raised in .* cancelled a batch whose CUDA graph had already run'):
        fit(late, graphed())

    class Early(Callback):  # cancels in `before_batch`, before CUDAGraphCB (the last there) replays: the batch is skipped, as eagerly
        cuda_graph = 'host'
        def before_batch(self, t):
            if t.training and t.epoch == 2 and t.batch_num == 3: raise CancelBatchException()
    _, w = fit(Early(), graphed())
    assert torch.equal(w, fit(Early(), all_eager())[1])

def test_a_last_smaller_batch_gets_its_own_graph_after_its_warm_up(capsys):
    "250 rows in batches of 32: a last batch of 26, eager in the first 3 epochs, replayed from the 5th (captured in the 4th); said once"
    dls = lambda: tensor_dls(n=250)
    t, w = fit(graphed(), dls=dls(), n_epochs=5)
    out = capsys.readouterr().out
    assert out.count('the training batches come in 2 shapes') == 1 and 'drop_last=True' in out, out
    assert t.CUDAGraphCB.counts['captured'] == 3 and torch.equal(w, fit(all_eager(), dls=dls(), n_epochs=5)[1])

def test_batches_whose_shape_changes_every_batch_are_said_to_keep_the_fit_eager():
    "Rows of 20 to 59 samples, never twice the same size in a row: after 16 shapes (twice `max_graphs`), a GraphWarning and the rest eager"
    x, y = torch.randn(1000, 8), torch.randint(0, 3, (1000,))
    sizes = [20 + (7 * i) % 40 for i in range(20)]  # 20 sizes, 790 rows
    batches = [(x[sum(sizes[:i]):sum(sizes[:i + 1])], y[sum(sizes[:i]):sum(sizes[:i + 1])]) for i in range(len(sizes))]
    dls = DataLoaders(batches, batches[:4])
    with pytest.warns(GraphWarning, match=r'the batches came in 17 shapes \(their sizes change from batch to batch\?\).*pad or bucket'):
        t, w = fit(graphed(), dls=dls, n_epochs=2)
    assert t.CUDAGraphCB.counts == {'eager': 16}
    torch.testing.assert_close(w, fit(dls=dls, n_epochs=2)[1], rtol=1e-4, atol=1e-5)  # (its first 16 steps read the rate from a float32 tensor)

def test_a_parameter_the_forward_does_not_use_is_left_alone_as_eagerly():
    "A trainable parameter that gets no gradient: eagerly AdamW skips it (no gradient, no step); a graph must not give it a zero one and decay it"
    class Spare(nn.Module):
        def __init__(self): super().__init__(); self.net, self.spare = mlp(), nn.Parameter(torch.ones(5))
        def forward(self, x): return self.net(x)
    t, w = fit(graphed(), model=Spare, opt_func=torch.optim.AdamW)
    assert t.CUDAGraphCB.counts['replayed'] > 0 and torch.equal(t.model.spare.detach(), torch.ones(5))
    assert torch.equal(w, fit(all_eager(), model=Spare, opt_func=torch.optim.AdamW)[1])

def test_unfreezing_makes_new_graphs():
    "A frozen first layer, unfrozen after 2 epochs: the graphs of the frozen model are left, new ones captured, the same weights as eagerly"
    class Unfreeze(Callback):
        cuda_graph = 'host'
        def before_fit(self, t): t.model[0].requires_grad_(False)
        def after_epoch(self, t):
            if t.training and t.epoch == 1: t.model[0].requires_grad_(True)
    t, w = fit(Unfreeze(), graphed())
    assert t.CUDAGraphCB.counts['captured'] == 3  # training frozen, validation, training unfrozen
    assert torch.equal(w, fit(Unfreeze(), all_eager())[1])

def test_a_pass_longer_than_the_ring_of_losses_keeps_every_loss():
    "A loader that says it has 2 batches and gives 8: the ring has 4 slots; the losses past it are copies, all kept right"
    class Liar(torch.utils.data.IterableDataset):
        def __init__(self, dl): self.dl = dl
        def __iter__(self): return iter(self.dl)
        def __len__(self): return 2
    dls = lambda: (d := tensor_dls(), setattr(d, 'train', Liar(d.train)), setattr(d, 'valid', Liar(d.valid)))[0]
    losses, ref = Losses(), Losses()
    t, w = fit(losses, graphed(), dls=dls())
    fit(ref, all_eager(), dls=dls())
    assert torch.equal(losses.values(), ref.values()) and len(losses.losses) == 32

def test_a_capture_that_fails_says_why_and_the_fit_goes_on_eagerly():
    "A forward that fails at the capture (as one reading a value would on a GPU): the rest of the fit is eager; `strict` stops it"
    class Fussy(nn.Module):
        def __init__(self): super().__init__(); self.net, self.calls = mlp(), 0
        def forward(self, x):
            self.calls += 1
            if self.calls == 4: raise RuntimeError('operation not permitted when stream is capturing')
            return self.net(x)
    with pytest.warns(GraphWarning, match=r'the training step could not be captured \(RuntimeError: operation not permitted.*The rest of this fit runs eagerly'):
        t, w = fit(graphed(), model=Fussy())
    assert t.CUDAGraphCB.counts == {'eager': 3} and len(t.history.get_metric_values('valid_loss')) == 4
    with pytest.raises(RuntimeError, match=r'CUDAGraphCB\(strict=True\) cannot graph this fit: the training step could not be captured'):
        fit(graphed(strict=True), model=Fussy())

# ---------------------------------------------------------------------------------------------------------------------
# checkpoints

def test_a_graphed_fit_resumes_exactly_from_inside_an_epoch(tmp_path):
    "Stopped after training batch 3 of epoch 2 and resumed (warm-up and capture again): the uninterrupted graphed run's weights and losses"
    def run(*cbs, resume=None):
        losses = Losses()
        t = make_trainer(OneCycleSchedulerCB(cycle_momentum=False), GradAccumCB(2), losses, graphed(), *cbs)
        t.fit(4, lr=1e-2, resume_from=resume)
        return t, losses
    t, losses = run()
    run(StopAt(tmp_path/'c.pt', 2, 3))
    t2, losses2 = run(resume=tmp_path/'c.pt')
    assert t2.CUDAGraphCB.counts['eager'] >= 3
    assert torch.equal(weights(t.model), weights(t2.model))
    assert torch.equal(losses.values()[-len(losses2.losses):], losses2.values())
    assert t.history.get_metric_values('valid_loss') == t2.history.get_metric_values('valid_loss')

def test_a_checkpoint_of_a_graphed_fit_holds_plain_floats_and_resumes_eagerly(tmp_path):
    "The groups' rates are floats in the checkpoint (the tensors are only in `opt.step`); an eager fit resumes it, near the graphed run"
    sched = lambda: OneCycleSchedulerCB(cycle_momentum=False)
    make_trainer(sched(), graphed(), StopAt(tmp_path/'g.pt', 1, 5)).fit(3, lr=1e-2)
    state = torch.load(tmp_path/'g.pt', weights_only=True)
    assert all(isinstance(g['lr'], float) for g in state['opt']['param_groups'])
    t = make_trainer(sched())
    t.fit(3, lr=1e-2, resume_from=tmp_path/'g.pt')
    torch.testing.assert_close(weights(t.model), fit(sched(), graphed(), n_epochs=3)[1], rtol=1e-4, atol=1e-5)

# ---------------------------------------------------------------------------------------------------------------------
# the GPU page (bench/gpu_page.ipynb), whose outputs a run on a lent GPU saves: its code keeps working on the CPU until then

def test_the_gpu_page_runs_on_the_cpu_with_its_cuda_cells_left_out(tmp_path):
    "bench/gpu_nb.py runs the page without its `cuda` cells: the hidden checks fit the vision and LM recipes graphed by EagerGraphs"
    pytest.importorskip('execnb', reason="execnb (nbdev's notebook runner) is not installed")
    import json, subprocess, sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root/'bench'/'gpu_nb.py'), str(root/'bench'/'gpu_page.ipynb'), str(tmp_path/'out.ipynb'), '--skip', 'cuda'],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cells = [c for c in json.loads((tmp_path/'out.ipynb').read_text())['cells'] if c['cell_type'] == 'code']
    ran = [c for c in cells if '#| cuda' not in ''.join(c['source'])]
    assert len(ran) >= 6 and not any(o['output_type'] == 'error' for c in ran for o in c.get('outputs', []))
    assert 'no GPU here' in ''.join(''.join(o.get('text', '')) for c in ran for o in c.get('outputs', []))
    assert not any(c.get('outputs') for c in cells if '#| cuda' in ''.join(c['source']))  # (left out: no outputs)

# ---------------------------------------------------------------------------------------------------------------------
# what callbacks keep across batches: the predictions a replay writes again (issue 46)

def _tm(name, **kw):
    "A torchmetrics metric, or a skip where torchmetrics is not installed"
    tm = pytest.importorskip('torchmetrics.classification')
    return getattr(tm, name)(**kw)

def _regression(n=256, seed=0):
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
    return x, x @ torch.randn(8, 2, generator=torch.Generator().manual_seed(99))

def _regression_dls():
    (x, y), (xv, yv) = _regression(256, 0), _regression(128, 1)
    return DataLoaders(TensorLoader(x, y, bs=32, shuffle=True, seed=0), TensorLoader(xv, yv, bs=64))

def _sequences(n, seed, vocab=11, T=6):
    x = torch.randint(0, vocab, (n, T + 1), generator=torch.Generator().manual_seed(seed))
    return x[:, :-1], (x[:, :-1] * 3 + 1) % vocab  # a token's label: a fixed function of it, learnable

def _sequence_dls():
    (x, y), (xv, yv) = _sequences(256, 0), _sequences(128, 1)
    return DataLoaders(TensorLoader(x, y, bs=32, shuffle=True, seed=0), TensorLoader(xv, yv, bs=64))

class _Tokens(nn.Module):
    def __init__(self, vocab=11): super().__init__(); self.emb, self.out = nn.Embedding(vocab, 16), nn.Linear(16, vocab)
    def forward(self, x): return self.out(self.emb(x).relu())

def _seq_loss(out, y): return nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())

# the torcheval metrics the docs use (MulticlassAccuracy, Perplexity, MeanSquaredError; torcheval's `Mean` takes no targets), those that keep their inputs
# until `compute` (AUROC, AUPRC, the precision-recall curve's area), and torchmetrics' (the pytorch-accelerated guide's)
from torcheval import metrics as tev
CLASSIFY = dict(model=mlp, dls=tensor_dls, loss=nn.CrossEntropyLoss)
METRICS = {
    'MulticlassAccuracy': (lambda: tev.MulticlassAccuracy(), CLASSIFY),
    'MulticlassAUROC': (lambda: tev.MulticlassAUROC(num_classes=3), CLASSIFY),
    'MulticlassAUPRC': (lambda: tev.MulticlassAUPRC(num_classes=3), CLASSIFY),
    'MulticlassPrecision, macro': (lambda: tev.MulticlassPrecision(num_classes=3, average='macro'), CLASSIFY),
    'MulticlassRecall, macro': (lambda: tev.MulticlassRecall(num_classes=3, average='macro'), CLASSIFY),
    'Perplexity': (lambda: tev.Perplexity(), dict(model=_Tokens, dls=_sequence_dls, loss=lambda: _seq_loss)),
    'MeanSquaredError': (lambda: tev.MeanSquaredError(), dict(model=lambda: mlp(n_out=2), dls=_regression_dls, loss=nn.MSELoss)),
    'R2Score': (lambda: tev.R2Score(), dict(model=lambda: mlp(n_out=2), dls=_regression_dls, loss=nn.MSELoss)),
    'torchmetrics MulticlassAUROC (exact: keeps its inputs)': (lambda: _tm('MulticlassAUROC', num_classes=3, thresholds=None), CLASSIFY),
    'torchmetrics MulticlassPrecision': (lambda: _tm('MulticlassPrecision', num_classes=3), CLASSIFY),
}

def _metric_fit(metric, setup, graph_cb, train_metrics=False):
    torch.manual_seed(0)
    from aisaac.trainer import Trainer
    from aisaac.callbacks.train import BasicTrainCB
    from aisaac.callbacks.metrics import MetricsCB
    t = Trainer(setup['dls'](), setup['loss'](), torch.optim.Adam, setup['model'](),
                callbacks=[BasicTrainCB(), MetricsCB(m=metric, train_metrics=train_metrics, show=False), graph_cb])
    t.fit(3, lr=1e-2)
    return t

@pytest.mark.parametrize('name', METRICS)
def test_every_metric_gives_the_eager_value_graphed(name):
    "Each epoch's value of the metric, graphed (replays from the 4th batch of each shape) and every batch eager, from the same seed: equal. "
    "AUROC keeps each batch's predictions until `compute`: handed the graph's output, which the next replay writes again, it read 0.713 "
    "for the eager 0.961 (every batch's predictions the last one's), while accuracy, which reduces them at once, was right"
    make, setup = METRICS[name]
    g, e = _metric_fit(make(), setup, graphed(), train_metrics=True), _metric_fit(make(), setup, all_eager(), train_metrics=True)
    assert g.CUDAGraphCB.counts['replayed'] >= 20 and g.CUDAGraphCB.why_eager is None, g.CUDAGraphCB.counts
    rows = lambda t: [{k: v for k, v in r.items() if k.endswith('m')} for r in t.MetricsCB.metrics_epoch]
    assert rows(g) == rows(e), (rows(g), rows(e))

# ---------------------------------------------------------------------------------------------------------------------
# a capture that fails leaves the process as it was (issue 48): `CUDAGraphs` on a CPU, torch.cuda's calls mocked

class _FakeCUDA:
    "What `CUDAGraphs.capture` calls of torch.cuda, on the CPU: streams (the current one), graphs whose capture may fail at its end, the allocator's pools"
    def __init__(self, end_fails):
        self.current, self.end_fails, self.graphs, self.pools = 'main', end_fails, [], {}
        fake = self
        class Stream:
            def __init__(self, *a, **k): self.name = f'side{len(fake.graphs)}'
            def wait_stream(self, s): pass
        class Graph:
            def __init__(self): self.capturing, self.reset_ = False, False; fake.graphs.append(self)
            def capture_begin(self, pool=None, capture_error_mode='global', **k):
                self.capturing, self.id = True, (len(fake.graphs), 0)
                fake.pools[self.id] = 'routed'  # the allocator sends the capture's allocations to the graph's pool
            def capture_end(self):
                self.capturing = False  # (cudaStreamEndCapture ends it, and fails: the capture was invalidated)
                if fake.end_fails: raise RuntimeError('CUDA error: operation not permitted when stream is capturing')
                fake.pools[self.id] = 'held'  # (then torch ends the routing: the graph holds its pool)
            def pool(self): return self.id
            def reset(self):
                self.reset_ = True
                if fake.pools.get(self.id) == 'held': fake.pools[self.id] = 'released'  # (a graph that was made: its pool goes)
        class stream:  # (as torch's StreamContext: the stream back in `__exit__`, and only there)
            def __init__(self, s): self.s = s
            def __enter__(self): self.before, fake.current = fake.current, self.s.name
            def __exit__(self, *a): fake.current = self.before
        def end_routing(dev, pool):
            if fake.pools.get(pool) != 'routed': raise RuntimeError('endAllocatePool: not currently recording to mempool_id')
            fake.pools[pool] = 'held'
        def release(dev, pool):
            if fake.pools.get(pool) != 'held': raise RuntimeError('no such pool')
            fake.pools[pool] = 'released'
        self.patches = [mock.patch('torch.cuda.Stream', Stream), mock.patch('torch.cuda.CUDAGraph', Graph), mock.patch('torch.cuda.stream', stream),
                        mock.patch('torch.cuda.synchronize', lambda *a: None), mock.patch('torch.cuda.empty_cache', lambda: None),
                        mock.patch('torch.cuda.current_device', lambda: 0), mock.patch('torch._C._host_emptyCache', lambda: None, create=True),
                        mock.patch('torch._C._cuda_endAllocateToPool', end_routing, create=True),
                        mock.patch('torch._C._cuda_releasePool', release, create=True),
                        mock.patch.object(torch.cuda.graph, 'default_capture_stream', None)]
    def __enter__(self):
        for p in self.patches: p.start()
        return self
    def __exit__(self, *a):
        for p in reversed(self.patches): p.stop()

@pytest.mark.parametrize('how', ['the step raises', "the capture's end raises"])
def test_a_capture_that_fails_leaves_the_stream_and_the_memory_as_they_were(how):
    "Before: `torch.cuda.graph`'s exit ended the capture before restoring the stream, so a capture whose end raised left the process on the "
    "capture stream (every later kernel on a side stream) with the allocator still routing to the dead graph's pool. Now: the current stream "
    "back, the routing ended, the pool released, the graph reset; and a capture that works still gives its graph"
    from aisaac.callbacks.graphplan import CUDAGraphs
    def step():
        if how == 'the step raises': raise RuntimeError('operation not permitted when stream is capturing')
    with _FakeCUDA(end_fails=True) as cuda:
        with pytest.raises(RuntimeError, match='operation not permitted'): CUDAGraphs().capture(step)
        g, = cuda.graphs
        assert cuda.current == 'main' and not g.capturing and g.reset_ and cuda.pools == {g.id: 'released'}, (cuda.current, cuda.pools)
    with _FakeCUDA(end_fails=False) as cuda:
        ran = []
        g = CUDAGraphs().capture(lambda: ran.append(cuda.current))
        assert ran == ['side0'] and cuda.current == 'main' and not g.reset_ and cuda.pools == {g.id: 'held'}

def test_aisaac_silences_the_capturable_warning_of_its_own_warm_up():
    "torch warns once when a `capturable` step runs uncaptured (a flag its optimizers set at construction, and lack once copied or unpickled); "
    "CUDAGraphCB's warm-up batches run it so on purpose: `make_capturable` sets the flag"
    import copy
    from aisaac.callbacks.graphplan import make_capturable
    opt = copy.deepcopy(torch.optim.AdamW(nn.Linear(2, 2).parameters()))  # (a copy: torch's `__setstate__` does not set the flag)
    assert not getattr(opt, '_warned_capturable_if_run_uncaptured', False)
    make_capturable(opt, cuda=True)
    assert opt.param_groups[0]['capturable'] and opt._warned_capturable_if_run_uncaptured

# ---------------------------------------------------------------------------------------------------------------------
# gradients: made by the graph (a whole step), or kept across batches (accumulation, a `zero_grad` that keeps them)

def test_a_whole_step_graph_leaves_no_gradient_as_an_eager_batch_does():
    "After a replayed batch no parameter holds a gradient (the graph made them, `zero_grad` let them go), as after an eager batch"
    class Grads(Callback):
        cuda_graph = 'host'
        def before_fit(self, t): self.held = []
        def after_batch(self, t):
            if t.training: self.held.append(sum(p.grad is not None for p in t.model.parameters()))
    t, w = fit(Grads(), graphed())
    assert t.CUDAGraphCB.counts['replayed'] > 20 and set(t.Grads.held) == {0}, t.Grads.held
    assert torch.equal(w, fit(all_eager())[1])

def test_gradients_left_by_eager_batches_are_added_to_not_dropped():
    "Accumulation that begins mid-fit (GradAccumCB from 1 to 2 batches a step after 2 epochs): the step's graph, captured from no gradient, meets "
    "those of the window's first batch, run eagerly (its warm-up); it is captured again, adding to them: the weights of the same fit never replayed"
    class Later(Callback):
        cuda_graph = 'host'
        def after_epoch(self, t):
            if t.training and t.epoch == 1: t.GradAccumCB.n_batches = 2
    t, w = fit(GradAccumCB(1), Later(), graphed(), n_epochs=5)
    assert t.CUDAGraphCB.counts['captured'] == 4 and t.CUDAGraphCB.why_eager is None, t.CUDAGraphCB.counts  # step, validation, the step again, no step
    assert torch.equal(w, fit(GradAccumCB(1), Later(), all_eager(), n_epochs=5)[1])

def test_a_zero_grad_that_keeps_the_gradients_is_graphed_as_eagerly():
    "`MomentumTrainCB` scales the gradients in `zero_grad` instead of zeroing them: they live across batches, the graphs add into them"
    from aisaac.callbacks.train import MomentumTrainCB
    def run(cb):
        torch.manual_seed(0)
        from aisaac.trainer import Trainer
        from aisaac.callbacks.metrics import MetricsCB
        t = Trainer(tensor_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, mlp(), callbacks=[MomentumTrainCB(0.5), MetricsCB(show=False), cb])
        t.fit(4, lr=1e-2)
        return t, weights(t.model)
    t, w = run(graphed())
    assert t.CUDAGraphCB.counts['replayed'] > 20 and t.CUDAGraphCB.why_eager is None, (t.CUDAGraphCB.counts, t.CUDAGraphCB.why_eager)
    assert torch.equal(w, run(all_eager())[1])

def test_predictions_in_a_tuple_kept_by_a_callback_are_each_batchs():
    "A model returning `(logits, aux)` and a callback that keeps them (`cuda_graph = 'keep'`): each batch's own, as eagerly (before, the "
    "stand-in's replays wrote no tuple into the graph's outputs, and a tuple was not copied for the callback)"
    class Pair(nn.Module):
        def __init__(self): super().__init__(); self.net = mlp()
        def forward(self, x): y = self.net(x); return y, {'double': 2 * y}
    class Keep(Callback):
        cuda_graph = 'keep'
        def before_fit(self, t): self.kept = []
        def after_batch(self, t):
            if not t.training: self.kept.append(t.preds)
    def run(cb):
        torch.manual_seed(0)
        from aisaac.trainer import Trainer
        from aisaac.callbacks.train import BasicTrainCB
        t = Trainer(tensor_dls(), lambda p, y: nn.functional.cross_entropy(p[0], y), torch.optim.Adam, Pair(), callbacks=[BasicTrainCB(), Keep(), cb])
        t.fit(4, lr=1e-2)
        return t, torch.cat([torch.cat([a, b['double']], 1) for a, b in t.Keep.kept])
    t, kept = run(graphed())
    assert t.CUDAGraphCB.counts['replayed'] > 20 and t.CUDAGraphCB.why_eager is None, t.CUDAGraphCB.counts
    assert torch.equal(kept, run(all_eager())[1])

def test_the_equality_checks_compare_values_not_bits():
    "A replay and an eager step may give a zero of the other sign (a gradient of -0.0 added into a zeroed tensor is 0.0): the tests' bit-for-bit "
    "checks (`torch.equal`, also in tests/test_cuda.py) compare values, in which -0.0 is 0.0; a bitwise comparison would not"
    a, b = torch.tensor([0.0, 1.5]), torch.tensor([-0.0, 1.5])
    assert torch.equal(a, b)
    assert not torch.equal(a.view(torch.int32), b.view(torch.int32))

def test_the_collectors_of_predictions_and_losses_get_each_batchs_graphed():
    "What keeps per-batch tensors across batches, graphed against every batch eager: `capture_preds` (its pass of 8 validation batches: "
    "3 warm-up, then replays), `ItemLossesCB` (each item's loss and the top inputs), and MetricsCB's losses"
    from aisaac.callbacks.interpret import ItemLossesCB
    import aisaac.callbacks.preds  # noqa: F401 (trainer.capture_preds)
    def run(cb):
        losses = Losses()
        t = make_trainer(ItemLossesCB(keep=4), losses, cb, dls=tensor_dls(bs=8))
        t.fit(3, lr=1e-2)
        l, counts = losses.values(), dict(cb.counts)  # (before capture_preds, whose fit starts them again)
        preds = t.capture_preds(inps=True)
        return t, preds, l, (counts, dict(cb.counts))
    t, (p, y, x), l, counts = run(graphed())
    t0, (p0, y0, x0), l0, _ = run(all_eager())
    assert counts[0]['replayed'] > 80 and counts[1]['replayed'] >= 4 and t.CUDAGraphCB.why_eager is None, counts
    assert torch.equal(p, p0) and torch.equal(y, y0) and torch.equal(x, x0) and torch.equal(l, l0)
    assert torch.equal(t.ItemLossesCB.losses, t0.ItemLossesCB.losses) and torch.equal(t.ItemLossesCB.top_idxs, t0.ItemLossesCB.top_idxs)

# ---------------------------------------------------------------------------------------------------------------------
# the averages and the spike guard (issue 46)

def test_a_graphed_fit_with_emacb_gives_the_eager_fits_average():
    """EMACB said nothing of its role, so graph_plan refused it ("EMACB handles `after_step`, and says nothing of how") and the fit ran
    eagerly: 0 batches replayed. Its update is Python around each replay (the due step read on the host, two foreach ops launched on the
    weights the graph stepped): graphed, the average, the validation on it and the weights are the eager fit's"""
    from aisaac.callbacks.averaging import EMACB
    with warnings.catch_warnings():
        warnings.simplefilter('error', GraphWarning)
        t, w = fit(EMACB(decay=0.9, start=3), graphed())
    t0, w0 = fit(EMACB(decay=0.9, start=3), all_eager())
    cb = t.CUDAGraphCB
    assert cb.counts['replayed'] > cb.counts['eager'] and cb.why_eager is None, cb.counts
    assert torch.equal(w, w0)
    avg, avg0 = t.EMACB.averaged_state(), t0.EMACB.averaged_state()
    assert t.EMACB.n_averaged == t0.EMACB.n_averaged == 4 * 8 - 3 + 1 and avg.keys() == avg0.keys()
    assert all(torch.equal(avg[k], avg0[k]) for k in avg)
    assert not torch.equal(avg['0.weight'], t.model[0].weight)  # (an average, not the weights)
    assert t.history.get_metric_values('valid_loss') == t0.history.get_metric_values('valid_loss')

@pytest.mark.parametrize('action', ['skip', 'rollback', 'stop'])
def test_lossspikecb_keeps_a_graphed_fit_eager_and_says_why(action):
    """LossSpikeCB said nothing of its role: the fit ran eagerly with "LossSpikeCB handles `after_loss`, and says nothing of how: declare
    `cuda_graph = ...`", which invites a declaration that would be wrong: it decides in `before_step` whether the step is taken (a skip,
    a rollback's or a stop's cancelled step), and a replayed batch's graph has applied the step and zeroed the gradients it reads by then"""
    from aisaac.callbacks.spikes import LossSpikeCB
    with pytest.warns(GraphWarning, match='this fit runs eagerly, because') as rec:
        t, w = fit(LossSpikeCB(action, warmup=2), graphed())
    msg = str(rec[0].message)
    assert 'LossSpikeCB decides in `before_step` whether the step is taken' in msg and 'says nothing of how' not in msg, msg
    assert t.CUDAGraphCB.counts == {}
    assert torch.equal(w, fit(LossSpikeCB(action, warmup=2))[1])
    with pytest.raises(ValueError, match=r'CUDAGraphCB\(strict=True\) refuses this fit, which cannot be graphed: LossSpikeCB decides'):
        fit(LossSpikeCB(action, warmup=2), graphed(strict=True))

@pytest.mark.parametrize('kw', [dict(momentum=0.9), dict(momentum=0.9, nesterov=True, weight_decay=0.01), dict(momentum=0.9, dampening=0.1, weight_decay=0.01),
                                dict(momentum=0.5, dampening=0.3, maximize=True)])
def test_fill_momentum_makes_a_fused_step_over_a_mix_of_buffers_the_plain_step(kw):
    "Two parameters, the second getting its first gradient at step 2 (an unfrozen body): the fused step (torch's raises a TypeError on the mix) equals the plain step"
    from aisaac.callbacks.graphplan import fill_momentum
    def run(fused):
        torch.manual_seed(0)
        ps = [nn.Parameter(torch.randn(5)), nn.Parameter(torch.randn(3))]
        opt = torch.optim.SGD(ps, lr=0.1, fused=fused, **kw)
        for i in range(3):
            for j, p in enumerate(ps): p.grad = torch.randn_like(p) if (j == 0 or i >= 1) else None
            if fused: fill_momentum(opt)
            opt.step()
        return [p.detach().clone() for p in ps] + [opt.state[p]['momentum_buffer'] for p in ps]
    for a, b in zip(run(False), run(True)): torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)  # (the fused kernel rounds as it does without a mix)

@pytest.mark.parametrize('setup_cb', ['ChunkedLossCB', 'DistillCB', 'SampleCB', 'PreferenceCB', 'RewardCB'])
def test_unfreezing_in_a_graphed_fit_steps_as_the_eager_fit(setup_cb):
    """The invariance harness's reproducer (issue 51, found 2026-12-02): UnfreezeCB x CUDAGraphCB in the setups that step with SGD and momentum
    raised `TypeError: expected Tensor as element 0 in argument 2, but got NoneType` at epoch 1 (the body's parameters without a momentum buffer
    beside the head's, in torch's fused step): now the graphed fit equals the eager one"""
    from aisaac.coverage import check
    assert check(['UnfreezeCB', setup_cb], 'graphs') == []

def test_unfreezecb_says_its_role_in_a_graphed_fit():
    "UnfreezeCB's per-batch handler reads the clock and flips `requires_grad` (the graphs' key): host work, declared, so CUDAGraphCB names it among no undeclared callbacks (a user's trial saw the advice to declare aisaac's own callback)"
    from aisaac.callbacks.graphplan import graph_role
    from aisaac.callbacks.schedule import UnfreezeCB
    assert graph_role(UnfreezeCB(), 'after_batch')[0] == 'host'

def test_a_graphed_fit_that_falls_back_keeps_filling_the_fused_momentum():
    """Found by the seeded sample (seed 3471627156): PreferenceCB + OneCycleSchedulerCB + UnfreezeCB under graphs. OneCycle moves the momentum,
    so CUDAGraphCB falls back to eager at epoch 1 and removes its hooks, but SGD keeps its fused step: the unfrozen body's first step raised
    torch's TypeError. The `fill_momentum` hook is now the optimizer's own, from `make_capturable`"""
    from aisaac.coverage import check
    assert check(['PreferenceCB', 'OneCycleSchedulerCB', 'UnfreezeCB'], 'graphs') == []
