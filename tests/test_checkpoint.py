"""Checkpoints: exact resume in a new process (torch's shuffled `DataLoader` and aisaac's `TensorLoader`, at an epoch's end and
inside an epoch), Ctrl-C from a callback and SIGINT to a process, a process killed in the middle of a save, and files that
must be refused: truncated, text, a key missing, another format version, a pickle that tries to run code."""
import os, pickle, signal, subprocess, sys, time
from pathlib import Path
import pytest
import torch
from torch import nn
from aisaac.core.callback import Callback, CancelFitException
from aisaac.persist import CheckpointError, atomic_save
from aisaac.checkpoint import CHECKPOINT_VERSION
from aisaac.callbacks.savers import CheckpointCB, SaveBestModelCB, PreemptionCB, checkpoints, last_checkpoint
from checkpoint_run import LOADERS, StopAt, make_trainer, result, resume

HERE = Path(__file__).parent

def run_script(*args, timeout=300):
    "Run tests/checkpoint_run.py in a new Python process"
    return subprocess.run([sys.executable, str(HERE/'checkpoint_run.py'), *map(str, args)], capture_output=True, text=True, timeout=timeout)

def assert_same(a, b, where=''):
    "Nested dicts/lists of tensors and numbers are equal, tensors bit for bit"
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a: assert_same(a[k], b[k], f'{where}.{k}')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)): assert_same(x, y, f'{where}[{i}]')
    else: assert a == b, f"{where}: {a!r} != {b!r}"

@pytest.fixture(scope='module')
def straight():
    "Each loader's 2-epoch run without stopping"
    res = {}
    for loader in LOADERS:
        t = make_trainer(loader)
        t.fit(2)
        res[loader] = result(t)
    return res

# ---------------------------------------------------------------- exact resume

def test_resume_in_a_new_process_is_bit_identical(straight, tmp_path):
    "1 epoch (or 1.5) + save, then a new process resumes for the rest: the same weights, optimizer, history and records"
    jobs, expect = [], []
    for loader in LOADERS:
        for batch in (None, 5):  # at the end of epoch 0, and after batch 5 of epoch 1
            ckpt, out = tmp_path/f'{loader}-{batch}.pt', tmp_path/f'{loader}-{batch}-out.pt'
            make_trainer(loader, [StopAt(ckpt, epoch=0 if batch is None else 1, batch=batch)]).fit(2)
            jobs += [loader, ckpt, 2, out]
            expect.append((loader, batch, out))
    p = run_script('resume', *jobs)
    assert p.returncode == 0, p.stderr[-3000:]
    for loader, batch, out in expect:
        assert_same(torch.load(out, weights_only=True), straight[loader], f'{loader}, stopped at batch {batch}')

def test_the_resumed_epoch_goes_on_with_the_same_batches_and_numbers(tmp_path):
    "A resume inside an epoch skips the batches done: the rest come in the same order, numbered as before"
    class Seen(Callback):
        def before_fit(self, trainer): self.seen = []
        def after_batch(self, trainer):
            if trainer.training: self.seen.append((trainer.epoch, trainer.batch_num, trainer.batch[1].tolist()))
    for loader in LOADERS:
        full = make_trainer(loader, [Seen()])
        full.fit(2)
        make_trainer(loader, [StopAt(tmp_path/'c.pt', epoch=1, batch=4)]).fit(2)
        resumed = make_trainer(loader, [Seen()])
        resumed.fit(2, resume_from=tmp_path/'c.pt')
        n = len(full.dls.train)
        assert resumed.Seen.seen == full.Seen.seen[n + 5:], loader

def test_ctrl_c_from_a_callback_after_a_checkpoint_then_resume(straight, tmp_path):
    class CtrlC(Callback):
        order = 200  # after the checkpoint of the batch
        def checkpoint(self, trainer, at):
            if (trainer.epoch, trainer.batch_num, at) == (1, 7, 'batch'): raise KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt): make_trainer('tensorloader', [CheckpointCB(tmp_path, every_n_batches=1), CtrlC()]).fit(2)
    last = last_checkpoint(tmp_path)
    assert last.name == 'checkpoint_0001_000008.pt' and len(checkpoints(tmp_path)) == 3
    assert_same(result(resume('tensorloader', last, 2)), straight['tensorloader'])

def test_sigint_to_a_training_process_then_resume(straight, tmp_path):
    "Ctrl-C (SIGINT) to a process that writes a checkpoint after every batch; its last checkpoint resumes exactly"
    # A shell without job control starts background jobs with SIGINT ignored (`make test &`, CI runners), and a Python started
    # so never raises KeyboardInterrupt: the child would train to its end. Ctrl-C reaches a process whose SIGINT is the default.
    p = subprocess.Popen([sys.executable, str(HERE/'checkpoint_run.py'), *map(str, ('checkpoints', 'dataloader', tmp_path, 2, 0.05))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while len(checkpoints(tmp_path)) < 16 and p.poll() is None and time.monotonic() < deadline: time.sleep(0.05)
        assert p.poll() is None, p.communicate()[1][-3000:]
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None: p.kill()
    assert p.returncode != 0 and 'KeyboardInterrupt' in err, err[-3000:]
    assert not list(tmp_path.glob('.*.tmp')), "an interrupted save leaves no temporary file"
    last = last_checkpoint(tmp_path)
    assert last.name >= 'checkpoint_0001_000002.pt', last  # inside the second epoch (13 batches per epoch)
    assert_same(result(resume('dataloader', last, 2)), straight['dataloader'])

def test_sigterm_preempts_a_training_process_which_resumes_exactly(straight, tmp_path):
    "SIGTERM mid-epoch: the batch finishes, a checkpoint is written, cleanups run (outcome 'preempted'), exit 143; the resume ends as the straight run"
    marker, dir = tmp_path/'batches', tmp_path/'ckpt'
    p = subprocess.Popen([sys.executable, str(HERE/'checkpoint_run.py'), *map(str, ('preempt', 'dataloader', dir, 2, 0.05, marker))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while (not marker.exists() or int(marker.read_text() or 0) < 17) and p.poll() is None and time.monotonic() < deadline: time.sleep(0.02)
        assert p.poll() is None, p.communicate()[1][-3000:]
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None: p.kill()
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, err[-3000:])
    assert 'SIGTERM received' in out and 'the fit returned' not in out
    assert marker.with_suffix('.outcome').read_text() == 'preempted'
    (ckpt,) = checkpoints(dir)
    assert ckpt.name > 'checkpoint_0001_000003.pt' and ckpt.name < 'checkpoint_0002', ckpt  # inside the second epoch (13 batches each)
    assert_same(result(resume('dataloader', ckpt, 2)), straight['dataloader'])

def test_preemption_without_exit_returns_preempted_and_closes_the_mlflow_run_as_killed(straight, tmp_path, monkeypatch):
    pytest.importorskip('mlflow')
    from mlflow.tracking import MlflowClient
    from aisaac.callbacks.trackers import MLflowLogger
    monkeypatch.chdir(tmp_path)
    class Notice(Callback):
        "The scheduler's notice, during training batch 5 of the second epoch"
        def after_batch(self, t):
            if t.training and t.epoch == 1 and t.batch_num == 5: signal.raise_signal(signal.SIGTERM)
    before = signal.getsignal(signal.SIGTERM)
    lg = MLflowLogger(f'sqlite:///{tmp_path}/m.db')
    t = make_trainer('dataloader', [PreemptionCB(tmp_path/'ckpt', exit=False), Notice(), lg])
    t.fit(2)
    assert t.outcome == 'preempted' and signal.getsignal(signal.SIGTERM) is before
    assert MlflowClient(lg.tracking_uri).get_run(lg.run_id).info.status == 'KILLED'
    (ckpt,) = checkpoints(tmp_path/'ckpt')
    assert ckpt.name == 'checkpoint_0001_000006.pt'
    assert_same(result(resume('dataloader', ckpt, 2)), straight['dataloader'])
    with pytest.raises(ValueError, match='no signal this system has'): PreemptionCB(signals=('SIGNOTHING',))

def test_a_checkpoint_after_the_run_resumes_to_the_same_end(straight, tmp_path):
    t = make_trainer()
    t.fit(2)
    t.save_checkpoint(tmp_path/'end.pt')
    assert t.resume_point() == (2, 0)
    assert_same(result(resume('dataloader', tmp_path/'end.pt', 2)), straight['dataloader'])
    with pytest.raises(CheckpointError, match=r'past this fit.s 1 epochs: resume with more epochs, `fit\(3'):
        make_trainer().fit(1, resume_from=tmp_path/'end.pt')

# ---------------------------------------------------------------- faults

def test_a_process_killed_during_a_save_leaves_the_previous_checkpoint(tmp_path, how='half'):
    "SIGKILL while the temporary file is half written (`how='whole'`: written but not yet renamed): the old checkpoint loads"
    path, marker = tmp_path/'ckpt.pt', tmp_path/'writing'
    p = subprocess.Popen([sys.executable, str(HERE/'checkpoint_run.py'), *map(str, ('kill_mid_save', path, marker, how))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and p.poll() is None and time.monotonic() < deadline: time.sleep(0.05)
        assert p.poll() is None, p.communicate()[1][-3000:]
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None: p.kill()
    assert p.returncode == -signal.SIGKILL
    tmp = Path(marker.read_text())
    assert tmp.parent == tmp_path and tmp.exists() and tmp.name.startswith('.ckpt.pt.')  # the stalled save's file, beside
    expected = make_trainer()
    expected.fit(1)
    t = make_trainer()
    t.load_checkpoint(path)
    assert t.resume_point() == (1, 0)
    assert_same(t.model.state_dict(), expected.model.state_dict())

@pytest.fixture
def ckpt(tmp_path):
    t = make_trainer()
    t.fit(1)
    return t.save_checkpoint(tmp_path/'good.pt')

def unchanged(check):
    "Call `check(trainer)`, which must raise, and assert the trainer's model and callbacks' state did not change"
    t = make_trainer()
    t.fit(1)
    before = (result(t), t.resume_point())
    check(t)
    assert_same((result(t), t.resume_point()), before)

def test_a_truncated_file_is_refused_with_a_clear_error(ckpt, tmp_path):
    bad = tmp_path/'truncated.pt'
    bad.write_bytes(ckpt.read_bytes()[:ckpt.stat().st_size // 2])
    def check(t):
        with pytest.raises(CheckpointError, match='is not a readable checkpoint: it is truncated, corrupt'): t.load_checkpoint(bad)
        with pytest.raises(CheckpointError, match='truncated'): t.fit(2, resume_from=bad)
    unchanged(check)

def test_a_text_file_is_refused_with_a_clear_error(tmp_path):
    bad = tmp_path/'notes.pt'
    bad.write_text('epoch 3, loss 0.25\n')
    def check(t):
        with pytest.raises(CheckpointError, match='notes.pt is a text file, not a checkpoint'): t.load_checkpoint(bad)
    unchanged(check)

@pytest.mark.parametrize('key', ['model', 'opt', 'rng', 'callbacks', 'epoch'])
def test_a_checkpoint_with_a_missing_key_is_refused(ckpt, tmp_path, key):
    state = torch.load(ckpt, weights_only=True)
    del state[key]
    torch.save(state, tmp_path/'partial.pt')
    def check(t):
        with pytest.raises(CheckpointError, match=f"lacks \\['{key}'\\]: it is incomplete"): t.load_checkpoint(tmp_path/'partial.pt')
    unchanged(check)

def test_other_versions_and_other_files_are_refused(ckpt, tmp_path):
    state = torch.load(ckpt, weights_only=True)
    torch.save({**state, 'version': CHECKPOINT_VERSION + 1}, tmp_path/'newer.pt')
    torch.save(make_trainer().model.state_dict(), tmp_path/'weights.pt')
    def check(t):
        with pytest.raises(CheckpointError, match=f'format version {CHECKPOINT_VERSION + 1}.*upgrade aisaac'): t.load_checkpoint(tmp_path/'newer.pt')
        with pytest.raises(CheckpointError, match=r'not an aisaac checkpoint.*model.load_state_dict'): t.load_checkpoint(tmp_path/'weights.pt')
        with pytest.raises(FileNotFoundError, match='No checkpoint at'): t.load_checkpoint(tmp_path/'missing.pt')
    unchanged(check)

def test_a_version_1_checkpoint_without_a_clock_still_loads(ckpt, tmp_path):
    "Version 2 added the clock and the stream of a run measured in steps; a version 1 file resumes as it did"
    state = {k: v for k, v in torch.load(ckpt, weights_only=True).items() if k not in ('clock', 'stream')} | {'version': 1}
    torch.save(state, tmp_path/'v1.pt')
    t = make_trainer()
    t.load_checkpoint(tmp_path/'v1.pt')
    assert t.epoch == state['epoch'] and t.clock.step == 0

def test_a_checkpoint_that_does_not_fit_changes_nothing(ckpt):
    def check(t):
        layer, t.model[0] = t.model[0], nn.Linear(4, 32, bias=False)
        with pytest.raises(CheckpointError, match=r"it has 0.bias, which the model lacks"): t.load_checkpoint(ckpt)
        t.model[0] = layer
    unchanged(check)
    def check(t):
        t.opt = torch.optim.AdamW([{'params': list(t.model.parameters())[:1]}, {'params': list(t.model.parameters())[1:]}])
        with pytest.raises(CheckpointError, match=r"optimizer's parameter groups have \[2, 2\] parameters, the trainer's \[1, 3\]"):  # (AdamW: weights, and biases without decay)
            t.load_checkpoint(ckpt)
    t = make_trainer()
    t.fit(1)
    check(t)

class Payload:
    "Runs a shell command when unpickled"
    def __init__(self, path): self.path = path
    def __reduce__(self): return (os.system, (f'touch {self.path}',))

@pytest.mark.filterwarnings('ignore:Detected pickle protocol')
def test_loading_never_runs_pickled_code(ckpt, tmp_path):
    "A checkpoint with a `__reduce__` payload, as a callback's state or as the whole file: refused, and the payload never runs"
    pwned = tmp_path/'pwned'
    state = torch.load(ckpt, weights_only=True)
    state['callbacks']['MetricsCB'] = {'x': Payload(pwned)}
    torch.save(state, tmp_path/'evil.pt')
    with open(tmp_path/'evil.pkl', 'wb') as f: pickle.dump(Payload(pwned), f)
    pickle.loads(pickle.dumps(Payload(tmp_path/'control')))  # the payload works when unpickled unsafely
    assert (tmp_path/'control').exists()
    def check(t):
        for bad in ('evil.pt', 'evil.pkl'):
            with pytest.raises(CheckpointError, match='was refused: it holds something other than tensors'): t.load_checkpoint(tmp_path/bad)
            with pytest.raises(CheckpointError, match='was refused'): t.fit(2, resume_from=tmp_path/bad)
    unchanged(check)
    assert not pwned.exists()

def test_atomic_save_replaces_the_file_in_one_step(tmp_path):
    path = atomic_save({'a': 1}, tmp_path/'sub'/'x.pt')
    assert torch.load(path, weights_only=True) == {'a': 1}
    assert [p.name for p in path.parent.iterdir()] == ['x.pt']
    with pytest.raises(KeyboardInterrupt):  # an interrupt during the write: the old file stays, no temporary file
        from aisaac.persist import atomic_write
        def interrupted(tmp):
            tmp.write_bytes(b'partial')
            raise KeyboardInterrupt()
        atomic_write(path, interrupted)
    assert torch.load(path, weights_only=True) == {'a': 1} and [p.name for p in path.parent.iterdir()] == ['x.pt']

# ---------------------------------------------------------------- CheckpointCB and SaveBestModelCB

def test_checkpoint_cb_prunes_only_after_a_new_checkpoint_is_written(tmp_path):
    class FailFourth:
        "The fourth save fails on the disk"
        def __init__(self): self.n = 0
        def before_save(self, engine):
            self.n += 1
            if self.n == 4: raise OSError('disk full')
    t = make_trainer(callbacks=[CheckpointCB(tmp_path, keep_last=2)])
    t.checkpoint_engine.add_callbacks(FailFourth())
    with pytest.raises(OSError, match='disk full'): t.fit(5)
    assert [p.name for p in checkpoints(tmp_path)] == ['checkpoint_0002_000000.pt', 'checkpoint_0003_000000.pt']
    assert not list(tmp_path.glob('.*.tmp'))
    resumed = make_trainer(callbacks=[CheckpointCB(tmp_path, keep_last=2)])
    resumed.fit(5, resume_from=last_checkpoint(tmp_path))
    assert [p.name for p in checkpoints(tmp_path)] == ['checkpoint_0004_000000.pt', 'checkpoint_0005_000000.pt']

def test_checkpoint_cb_removes_the_temporary_files_of_dead_processes(tmp_path):
    dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
    stale = tmp_path/f'.checkpoint_0001_000000.pt.{int(dead.stdout)}-0123abcd.tmp'
    live = tmp_path/f'.checkpoint_0001_000000.pt.{os.getppid()}-0123abcd.tmp'  # a running process's save in progress
    stale.write_bytes(b'half'); live.write_bytes(b'half')
    make_trainer(callbacks=[CheckpointCB(tmp_path)]).fit(1)
    assert not stale.exists() and live.exists()

class Scores(Callback):
    "Records `values[epoch]` as the epoch's `valid_loss` in the history; `stop_at`: cancel the fit after that epoch, `interrupt_at`: Ctrl-C"
    order = -1
    def __init__(self, values, stop_at=None, interrupt_at=None): self.values, self.stop_at, self.interrupt_at = values, stop_at, interrupt_at
    def before_fit(self, trainer): self.weights = []
    def after_validate(self, trainer):
        self.weights.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
        trainer.history.update_metric('valid_loss', self.values[trainer.epoch], step=trainer.epoch)
        if trainer.epoch == self.interrupt_at: raise KeyboardInterrupt()
        if trainer.epoch == self.stop_at: raise CancelFitException()

def scored_trainer(callbacks):
    "A trainer whose only reported metric is the made-up `valid_loss` of `Scores`"
    t = make_trainer(callbacks=callbacks)
    t.remove_callbacks(t.MetricsCB)
    return t

def test_save_best_model_loads_the_best_weights_after_early_stopping_not_after_ctrl_c(tmp_path):
    t = scored_trainer([SaveBestModelCB(tmp_path/'best.pt'), s := Scores([0.5, 0.2, 0.4, 0.3], stop_at=2)])
    t.fit(4)
    assert t.SaveBestModelCB.best_epoch == 1
    assert_same(t.model.state_dict(), s.weights[1])
    t = scored_trainer([SaveBestModelCB(tmp_path/'best2.pt'), s := Scores([0.5, 0.2, 0.4, 0.3], interrupt_at=2)])
    with pytest.raises(KeyboardInterrupt): t.fit(4)
    assert_same(t.model.state_dict(), s.weights[2])  # kept as it was, for a checkpoint to resume from
    assert_same(torch.load(tmp_path/'best2.pt', weights_only=True), s.weights[1])

def test_save_best_model_keeps_its_best_score_through_a_resume(tmp_path):
    "The best score is in the checkpoint: a resumed fit does not save a worse epoch (reset_on_train resets a new fit only)"
    cbs = lambda: [SaveBestModelCB(tmp_path/'best.pt'), Scores([0.5, 0.2, 0.4, 0.3]), CheckpointCB(tmp_path/'ckpt', keep_last=None)]
    straight = scored_trainer(cbs())
    straight.fit(4)
    weights = straight.Scores.weights
    t = scored_trainer(cbs())
    t.fit(4, resume_from=tmp_path/'ckpt'/'checkpoint_0002_000000.pt')
    assert (t.SaveBestModelCB.best, t.SaveBestModelCB.best_epoch) == (0.2, 1)
    assert_same(t.model.state_dict(), weights[1])
    assert_same(torch.load(tmp_path/'best.pt', weights_only=True), weights[1])

# ---------------------------------------------------------------- SaveBestModelCB watches the run history
def test_save_best_model_without_anything_that_records_its_metric_is_an_error(tmp_path):
    "No MetricsCB: before, it trained the whole run and saved nothing; now the fit does not start (every callback declares what it provides)"
    t = scored_trainer([SaveBestModelCB(tmp_path/'best.pt')])
    with pytest.raises(ValueError, match=r"SaveBestModelCB needs 'valid_loss', which none of the callbacks of this fit provides"):
        t.fit(4)
    assert t.clock.step == 0 and not (tmp_path/'best.pt').exists()

def test_save_best_model_with_an_undeclared_callback_is_an_error_after_the_first_epoch(tmp_path):
    "A callback of yours that does not declare `provides` might record the metric: then the first epoch's end names the metrics that exist"
    class Quiet(Callback):
        def after_epoch(self, t): pass
    t = scored_trainer([SaveBestModelCB(tmp_path/'best.pt'), Quiet()])
    with pytest.raises(ValueError, match=r"SaveBestModelCB watches 'valid_loss', which was not recorded in trainer.history in epoch 0"):
        t.fit(4)
    assert t.epoch == 0 and not (tmp_path/'best.pt').exists()

def test_save_best_model_sees_a_metric_that_another_callback_records_in_the_history(tmp_path):
    "pytorch-accelerated's semantics: whoever records the metric, SaveBestModelCB reads it at the end of the epoch"
    class Score(Callback):  # records a score of its own, never sent through `trainer.log`
        def __init__(self, values): self.values = values
        def cleanup_validate(self, t): t.history.update_metric('score', self.values[t.epoch], step=t.epoch)
    t = make_trainer(callbacks=[SaveBestModelCB(tmp_path/'best.pt', watch_metric='score', greater_is_better=True), Score([0.1, 0.7, 0.4])])
    t.fit(3)
    assert (t.SaveBestModelCB.best, t.SaveBestModelCB.best_epoch) == (0.7, 1) and (tmp_path/'best.pt').exists()

def test_save_best_model_leaves_the_best_model_alone_in_a_validation_only_fit(tmp_path):
    "`capture_preds`-like fits (`train=False`) neither save nor load the best weights"
    t = make_trainer(callbacks=[keep := SaveBestModelCB(tmp_path/'best.pt', reset_on_train=False)])
    t.fit(2)
    best, mtime = keep.best, (tmp_path/'best.pt').stat().st_mtime_ns
    with torch.no_grad(): t.model[0].weight.add_(1.)
    w = t.model[0].weight.detach().clone()
    t.fit(1, train=False)
    assert keep.best == best and (tmp_path/'best.pt').stat().st_mtime_ns == mtime and torch.equal(t.model[0].weight, w)

def test_a_plain_state_is_not_tried_and_anything_else_is():
    "`_loads_back` takes tensors, numbers, strings and None in dicts, lists and tuples as they are; anything else is tried with `weights_only=True`"
    import collections
    from aisaac.checkpoint import _loads_back, _plain
    plain = {'w': torch.ones(2), 'n': 3, 'x': [1.5, None, ('a', b'b', True)], 4: {'deep': [torch.zeros(1)]}}
    assert _plain(plain) and _loads_back('it', plain) is plain
    for ok in (collections.OrderedDict(a=torch.ones(1)), {'size': torch.Size([2, 3])}, nn.Parameter(torch.ones(1)), {1, 2}):
        assert not _plain(ok) and _loads_back('it', ok) is ok  # not plain, and loads back: tried, taken
    for bad in ({'f': lambda: 0}, [object()], collections.defaultdict(list)):
        assert not _plain(bad)
        with pytest.raises(CheckpointError, match='The state of it cannot go in a checkpoint'): _loads_back('it', bad)

def test_a_second_fit_numbers_its_checkpoints_after_the_first_and_resumes_its_own(tmp_path):
    "Two fits of one trainer, one `CheckpointCB(keep_last=None)`: 4 files, none overwritten (before: the second fit's replaced the first's, same names); the second fit's resumes it exactly"
    from tiny import make_trainer
    ckpt = CheckpointCB(tmp_path, keep_last=None)
    t = make_trainer([ckpt], n_train=(3,) * 4)
    t.fit(2, lr=0.1)
    t.fit(2, lr=0.1)
    names = [p.name for p in checkpoints(tmp_path)]
    assert names == [f'checkpoint_{e:04d}_000000.pt' for e in (1, 2, 3, 4)], names
    steps = [torch.load(tmp_path/n, weights_only=True)['clock']['step'] for n in names]
    assert steps == [4, 8, 12, 16]
    again = make_trainer([CheckpointCB(tmp_path/'b', keep_last=None)], n_train=(3,) * 4)
    again.fit(2, lr=0.1, resume_from=tmp_path/'checkpoint_0003_000000.pt')
    for k, v in t.model.state_dict().items(): assert torch.equal(v, again.model.state_dict()[k]), k
    assert [p.name for p in checkpoints(tmp_path/'b')] == ['checkpoint_0004_000000.pt']  # named as the run it continues

@pytest.mark.parametrize('gone', ['file', 'folder'])
def test_a_checkpoint_removed_while_the_folder_is_listed_is_left_out(tmp_path, monkeypatch, gone):
    """Another process's CheckpointCB removes its oldest checkpoints beyond `keep_last` while `checkpoints`/`last_checkpoint` read the
    folder (the chaos harness watches a run's folder so): one listed, then removed before its time is read, is left out of the
    list, and `last_checkpoint` takes the newest without a warning about it. Before, `checkpoints` raised FileNotFoundError
    from the `stat` of the file the listing had named"""
    (tmp_path/'checkpoint_0000_000001').mkdir()  # a sharded checkpoint's folder (the oldest)
    for i, n in enumerate(['checkpoint_0000_000002.pt', 'checkpoint_0000_000003.pt']):
        atomic_save({'x': torch.zeros(1)}, tmp_path/n)
        os.utime(tmp_path/n, ns=(10**18 + i, 10**18 + i))
    os.utime(tmp_path/'checkpoint_0000_000001', ns=(10**17, 10**17))
    oldest = tmp_path/('checkpoint_0000_000002.pt' if gone == 'file' else 'checkpoint_0000_000001')
    glob = Path.glob
    def glob_then_remove(self, pattern, *args, **kwargs):
        found = list(glob(self, pattern, *args, **kwargs))
        if oldest in found: (oldest.rmdir if oldest.is_dir() else oldest.unlink)()  # removed between the listing and the rest
        return iter(found)
    monkeypatch.setattr(Path, 'glob', glob_then_remove)
    assert [p.name for p in checkpoints(tmp_path)] == sorted({'checkpoint_0000_000001', 'checkpoint_0000_000002.pt', 'checkpoint_0000_000003.pt'} - {oldest.name})
    assert not oldest.exists()
    (oldest.mkdir() if gone == 'folder' else atomic_save({'x': torch.zeros(1)}, oldest))  # there again, for the next listing to remove
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert last_checkpoint(tmp_path, check=False).name == 'checkpoint_0000_000003.pt'  # (the files are no real checkpoints)
