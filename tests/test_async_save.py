"""Checkpoints written in the background (issue 40): `CheckpointCB(background=True)` lets the loop go on while a write is under
way (held here by a callback on the engine's `save` phase), writes the state of the checkpoint event whatever the steps after it
do, raises a write's failure at the next step, waits for the writes under way at the fit's end, before a preemption's save and
before a write beyond `in_flight`; `last_checkpoint` never returns a checkpoint still being written. The sharded path on 2 gloo
processes: `test_dcp.py`'s last tests."""
import errno, threading, time, warnings
from pathlib import Path
import pytest
import torch
from torch import nn
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, TensorLoader
from aisaac.utils import set_seed
from aisaac.persist import CheckpointEngine, CheckpointQueue, CheckpointWriteError, snapshot, verify
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.savers import CheckpointCB, PreemptionCB, checkpoints, last_checkpoint

def trainer(*cbs, rows=640):
    "A seeded MLP on `rows` rows (640: 20 batches an epoch), Adam: the same run every time"
    set_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 8, generator=g); y = (x[:, 0] > 0).long()
    dls = DataLoaders(TensorLoader(x, y, bs=32, shuffle=True, seed=1), TensorLoader(x[:rows//5], y[:rows//5], bs=64))
    return Trainer(dls, nn.CrossEntropyLoss(), torch.optim.Adam, nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)),
                   callbacks=[BasicTrainCB(), MetricsCB(show=False), *cbs])

def weights(t): return [p.detach().clone() for p in t.model.parameters()]

def same(a, b):
    "Nested dicts and lists of tensors and plain values are equal, tensors bit for bit"
    if isinstance(a, torch.Tensor): return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict): return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)): return len(a) == len(b) and all(map(same, a, b))
    return a == b

class Gate:
    "On a checkpoint engine: holds each of its writes (in the `save` phase) until `go` is set (`after` seconds after the first, if given)"
    def __init__(self, after=None): self.go, self.held, self.after = threading.Event(), 0, after
    def before_save(self, engine, state):
        if self.held == 0 and self.after is not None: threading.Timer(self.after, self.go.set).start()
        self.held += 1
        assert self.go.wait(60), 'the gate was never opened'

class Watch(Callback):
    "The training batches taken while `gate` holds a write, with what `last_checkpoint(dir)` returned at each; opens it after `n`"
    order = 1000  # after CheckpointCB, at the checkpoint event
    def __init__(self, gate, dir, n=3): self.gate, self.dir, self.n, self.batches, self.seen = gate, dir, n, [], []
    def checkpoint(self, trainer, at):
        if at != 'batch' or trainer.CheckpointCB.last is None or self.gate.go.is_set(): return  # (from the first checkpoint)
        self.batches.append(trainer.clock.step)
        self.seen.append(last_checkpoint(self.dir))
        if len(self.batches) > self.n: self.gate.go.set()

def fit(t, steps=30, **kw): t.fit(steps=steps, valid_every=10, lr=1e-2, **kw)

def test_the_loop_goes_on_while_a_checkpoint_is_written_and_last_checkpoint_never_returns_it(tmp_path):
    "A write held by a callback on the engine's `save` phase: the loop takes 4 more batches meanwhile; `last_checkpoint` returns the one before"
    gate = Gate()
    t = trainer(CheckpointCB(tmp_path, every='5 steps', every_n_epochs=None, keep_last=None, background=True), w := Watch(gate, tmp_path))
    t.checkpoint_engine.add_callbacks(gate)
    fit(t)
    assert w.batches == [5, 6, 7, 8], w.batches  # steps 6 to 8 were taken while the checkpoint of step 5 was held
    assert w.seen == [None] * 4, w.seen  # never the checkpoint being written
    assert [p.name for p in checkpoints(tmp_path)] == [f'checkpoint_step_{s:06d}.pt' for s in (5, 10, 15, 20, 25, 30)]
    assert all(verify(p) for p in checkpoints(tmp_path))

def test_a_synchronous_checkpoint_stops_the_loop_for_its_write(tmp_path):
    "The contrast: without `background`, no batch is taken while the write is held (a timer opens the gate)"
    gate = Gate(after=0.5)
    t = trainer(CheckpointCB(tmp_path, every='5 steps', every_n_epochs=None), w := Watch(gate, tmp_path))
    t.checkpoint_engine.add_callbacks(gate)
    fit(t, steps=10)
    assert w.batches == [] and gate.held == 2

def test_the_state_written_is_the_checkpoint_events_and_resumes_bit_identical(tmp_path):
    "Held while 4 more steps change the weights in place, the file is byte for byte what a synchronous checkpoint at the same step holds; "
    "a resume from it ends as the uninterrupted run"
    straight = trainer(CheckpointCB(tmp_path/'sync', every='5 steps', every_n_epochs=None, keep_last=None))
    fit(straight)
    gate = Gate()
    t = trainer(CheckpointCB(tmp_path/'bg', every='5 steps', every_n_epochs=None, keep_last=None, background=True), Watch(gate, tmp_path/'bg'))
    t.checkpoint_engine.add_callbacks(gate)
    fit(t)
    for name in ('checkpoint_step_000005.pt', 'checkpoint_step_000020.pt'):
        a, b = (torch.load(tmp_path/d/name, weights_only=True) for d in ('sync', 'bg'))
        a['clock'].pop('seconds'); b['clock'].pop('seconds')  # (the time the run took: its own)
        assert same(a, b), (name, [k for k in a if not same(a[k], b[k])])
    resumed = trainer()
    fit(resumed, resume_from=tmp_path/'bg'/'checkpoint_step_000005.pt')
    assert same(weights(resumed), weights(straight)) and same(resumed.history.state_dict(), straight.history.state_dict())

def test_a_failed_background_write_is_raised_at_the_next_step_with_its_cause(tmp_path, monkeypatch):
    "The disk is full in the background write of step 5, which fails while step 6 is taken: the fit raises `CheckpointWriteError` "
    "(the cause, the free space) at step 6's checkpoint event, never silently; nothing is left half-written"
    real, seen, go = torch.save, [], threading.Event()
    def full_disk(obj, f, *args, **kwargs):
        if threading.current_thread() is threading.main_thread(): return real(obj, f, *args, **kwargs)
        go.wait(30)
        Path(f).write_bytes(b'\0' * 100)
        raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(torch, 'save', full_disk)
    class Step6(Callback):
        def after_batch(self, t):
            seen.append(t.clock.step)
            if t.clock.step == 6:  # the write fails now, before this step's checkpoint event
                go.set()
                while t.checkpoint_engine.queue.writes(): time.sleep(0.01)
    t = trainer(CheckpointCB(tmp_path, every='5 steps', every_n_epochs=None, background=True), Step6())
    with pytest.raises(CheckpointWriteError) as e: fit(t)
    assert 'the disk is full (ENOSPC)' in str(e.value) and 'checkpoint_step_000005.pt' in str(e.value), str(e.value)
    assert any('in the background' in n for n in e.value.__notes__), e.value.__notes__
    assert seen[-1] == 6, seen  # raised at the first step after the write failed
    assert list(tmp_path.iterdir()) == []

def test_a_failure_in_the_background_thread_is_raised_even_when_the_fit_ends_first(tmp_path):
    "A write that fails after the last step is raised by the fit's end (it waits for the writes under way)"
    class Fails:
        def before_save(self, engine, state):
            time.sleep(0.3)
            raise ValueError('a broken engine callback')
    t = trainer(CheckpointCB(tmp_path, every_n_epochs=1, background=True))
    t.checkpoint_engine.add_callbacks(Fails())
    with pytest.raises(CheckpointWriteError, match='a broken engine callback') as e: t.fit(1)
    assert isinstance(e.value.__cause__, ValueError)

def test_the_fit_returns_only_once_the_writes_under_way_are_whole(tmp_path):
    "The last checkpoint of a fit, held 1 s from the moment it is asked for: `fit` returns with the file there, whole"
    gate = Gate(after=1.0)
    t = trainer(CheckpointCB(tmp_path, every_n_epochs=1, background=True))
    t.checkpoint_engine.add_callbacks(gate)
    t0 = time.monotonic()
    t.fit(1)
    assert gate.held == 1 and gate.go.is_set() and time.monotonic() - t0 >= 1.0
    assert [p.name for p in checkpoints(tmp_path)] == ['checkpoint_0001_000000.pt'] and verify(tmp_path/'checkpoint_0001_000000.pt')

def test_a_second_checkpoint_waits_for_the_one_under_way_beyond_in_flight(tmp_path):
    "With `in_flight=1` the checkpoint of step 2 waits while that of step 1 is held: the loop stops there; with 2, it goes on to step 3"
    for in_flight, expect in ((1, [1, 2]), (2, [1, 2, 3])):
        gate, steps = Gate(after=1.0), []
        class Steps(Callback):
            def after_batch(self, t):
                if not gate.go.is_set(): steps.append(t.clock.step)
        t = trainer(CheckpointCB(tmp_path/str(in_flight), every='1 step', every_n_epochs=None, keep_last=None, background=True), Steps())
        t.checkpoint_engine = CheckpointEngine(gate, in_flight=in_flight)
        fit(t, steps=10)
        assert steps == expect, (in_flight, steps)
        assert [p.name for p in checkpoints(tmp_path/str(in_flight))] == [f'checkpoint_step_{s:06d}.pt' for s in range(1, 11)]

def test_a_preemption_waits_for_the_write_under_way_then_saves(tmp_path):
    "A notice while a background write is held: the preemption's checkpoint (in the foreground) is written after it, and the run resumes from it"
    straight = trainer()
    fit(straight)
    gate = Gate(after=1.0)
    class Notice(Callback):
        def after_batch(self, t):
            if t.clock.step == 7: t.PreemptionCB._notice(15, None)
    t = trainer(CheckpointCB(tmp_path, every='5 steps', every_n_epochs=None, background=True), PreemptionCB(tmp_path, exit=False), Notice())
    t.checkpoint_engine.add_callbacks(gate)
    fit(t)
    assert t.outcome == 'preempted' and gate.held == 2
    assert [p.name for p in checkpoints(tmp_path)] == ['checkpoint_step_000005.pt', 'checkpoint_step_000007.pt']
    resumed = trainer()
    fit(resumed, resume_from=last_checkpoint(tmp_path))
    assert same(weights(resumed), weights(straight))

def test_the_queue_drops_the_jobs_behind_a_failure_and_goes_on_after_raising_it():
    q, ran, go = CheckpointQueue(), [], threading.Event()
    def fails():
        go.wait(10)
        raise OSError(errno.EIO, 'Input/output error')
    q.submit(fails, 'the first')
    q.submit(lambda: ran.append('behind'), 'the clean-up after it', write=False)
    go.set()
    with pytest.raises(CheckpointWriteError) as e: q.wait()
    assert 'Could not write the first in the background: OSError' in str(e.value) and 'the clean-up after it' in e.value.__notes__[0]
    assert ran == []
    q.submit(lambda: ran.append('after'), 'the next')
    q.wait()
    assert ran == ['after']
    with pytest.raises(ValueError, match='at least 1'): CheckpointQueue(0)

def test_snapshot_copies_every_tensor_keeps_shared_memory_shared_and_deep_copies_the_rest():
    w = torch.arange(6.).reshape(2, 3)
    state = {'w': w, 'row': w[1], 'hist': [{'loss': 1.0}], 'p': nn.Parameter(torch.ones(2))}
    s = snapshot(state)
    w += 10; state['hist'][0]['loss'] = 2.0
    assert torch.equal(s['w'], torch.arange(6.).reshape(2, 3)) and torch.equal(s['row'], torch.tensor([3., 4., 5.]))
    assert s['row'].untyped_storage().data_ptr() == s['w'].untyped_storage().data_ptr()
    assert s['hist'] == [{'loss': 1.0}] and type(s['p']) is torch.Tensor and not s['p'].requires_grad
