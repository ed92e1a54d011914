"""Sharded checkpoints (aisaac.dcp) of a tiny GPT sharded per block with FSDP2's `fully_shard`, on CPU processes (torchrun, gloo):
every process writes its shards and its random state into a folder that appears only once all have; the checkpoint resumes on 2
processes, on 1 (sharded or not) and the reverse with the uninterrupted run's weights; a process killed in the middle of a write
leaves the previous checkpoint the newest complete one; a sharded checkpoint gathers into one file for inference."""
import json, os, signal, subprocess, sys, warnings
from pathlib import Path
import pytest
import torch
from aisaac.models import GPT
from aisaac.dcp import consolidate_checkpoint, folder_problem
from aisaac.callbacks.savers import checkpoints, last_checkpoint

HERE = Path(__file__).parent
LIMIT = 600  # seconds for one launch, a guard against a hang: each takes about 15 s on 2 idle cores, minutes on loaded ones

def launch(out, nproc, *jobs, env=None):
    "Run tests/dcp_run.py's `jobs` on `nproc` processes (torchrun), or on one plain process (`nproc=0`), with `env` added to the environment; its log and return code"
    run = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', str(nproc)] if nproc else [sys.executable]
    env = {**os.environ, 'PYTHONPATH': str(HERE.parent), 'OMP_NUM_THREADS': '1', **(env or {})}
    p = subprocess.Popen([*run, str(HERE/'dcp_run.py'), str(out), *jobs], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env=env, cwd=out)
    try: log, _ = p.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # torchrun and its processes
        p.communicate()
        pytest.fail(f"{jobs} on {nproc} process(es) did not end in {LIMIT} s: a process waits for another")
    return log, p.returncode

def ok(out, nproc, *jobs, env=None):
    log, rc = launch(out, nproc, *jobs, env=env)
    if rc != 0 and 'terminate called without an active exception' in log:  # a gloo thread torn down by C++ at a process's exit, seen
        log, rc = launch(out, nproc, *jobs, env=env)                        # once in ~10 runs on a loaded machine: the jobs run again
    assert rc == 0, log[-4000:]

def result(out, name, rank=0): return json.loads((out/f'{name}_{rank}.json').read_text())
def weights(out, name): return torch.load(out/f'{name}.pt', weights_only=True)

def assert_same(a, b, exact=False):
    assert sorted(a) == sorted(b)
    for k in a:
        if exact: assert torch.equal(a[k], b[k]), k
        else: torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-4, msg=k)

MID = 'checkpoint_0000_000004'  # after 4 of the 8 steps of epoch 0

def together(*launches):
    "`ok` for each of `launches` (`(out, nproc, *jobs)`), all at once: single processes, which together take both cores"
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(launches)) as pool:
        for f in [pool.submit(ok, *l) for l in launches]: f.result()

@pytest.fixture(scope='module')
def dcp_dirs(tmp_path_factory):
    """The folders of `runs`, `fsdp_runs` and `logs`, whose jobs run in 3 launches in all (a launch costs several seconds, each job
    less): the 2-process jobs of all three that need no other's checkpoint, then the 1-process sharded ones and the plain ones at once,
    then the 2-process resumes of their checkpoints. `@FOLDER` among a launch's jobs: the next jobs write their results there"""
    out, fout, lout = (tmp_path_factory.mktemp(n) for n in ('dcp', 'fsdp', 'dcp_logs'))
    ok(out, 2, f'straight:s2:{out}/c2:2', f'resume:r2:{out}/c2/{MID}:2', f'export:e2:{out}/c2', f'preempt:pre:{out}/cpre:2',
       f'resume:rpre2:{out}/cpre/{MID}:2', f'@{fout}', *fsdp_jobs(fout), f'@{lout}', *logs_jobs(lout))
    together((out, 1, f'resume:r1:{out}/c2/{MID}:2', f'straight:s1:{out}/c1:2'),
             (out, 0, f'resume:p1:{out}/c2/{MID}:2', f'straight:ps:{out}/cp:2', f'resume:rpre1:{out}/cpre/{MID}:2',
              f'@{fout}', f'resume:fp1:{fout}/c2/{MID}:2', f'resume:frpre1:{fout}/cpre/{MID}:2'))
    ok(out, 2, f'resume:r21:{out}/c1/{MID}:2', f'resume:rp2:{out}/cp/{MID}.pt:2')
    return out, fout, lout

@pytest.fixture(scope='module')
def runs(dcp_dirs):
    """The uninterrupted runs (2 epochs) on 2 sharded processes (s2), on 1 sharded (s1), on 1 plain (ps, file checkpoints), and the
    resumes of their checkpoints after 4 steps: s2's on 2 (r2), on 1 sharded (r1) and on 1 plain (p1); s1's on 2 (r21); ps's on 2 (rp2)"""
    return dcp_dirs[0]

def test_a_sharded_checkpoint_is_a_folder_each_process_wrote_its_part_of(runs):
    "Every 4 steps a folder: the shards of both processes, the random state of each, the rest of the checkpoint; nothing left over"
    names = [p.name for p in checkpoints(runs/'c2')]
    assert names == ['checkpoint_0000_000004', 'checkpoint_0000_000008', 'checkpoint_0001_000004', 'checkpoint_0001_000008']
    assert sorted(os.listdir(runs/'c2'/MID)) == ['.metadata', '__0_0.distcp', '__1_0.distcp', 'rng_0.pt', 'rng_1.pt', 'state.pt']
    assert sorted(os.listdir(runs/'c2')) == names  # no temporary folder left
    assert all(folder_problem(p) is None for p in checkpoints(runs/'c2'))
    state = torch.load(runs/'c2'/MID/'state.pt', weights_only=True)
    assert (state['epoch'], state['batch'], state['world_size'], state['model']) == (0, 4, 2, None)
    assert 'OneCycleSchedulerCB' in state['callbacks'] and state['clock'] is not None

def test_resumed_on_the_same_number_of_processes_the_weights_and_each_process_random_state_are_the_run_own(runs):
    "Resumed on 2 from the checkpoint after 4 steps: the final weights equal the uninterrupted run's exactly; each process gets its own random state back"
    assert_same(weights(runs, 'r2'), weights(runs, 's2'), exact=True)
    for rank in (0, 1):
        assert result(runs, 'r2', rank)['loaded'] == result(runs, 's2', rank)['saved']['0_3']
        assert result(runs, 'r2', rank)['warnings'] == []
    assert result(runs, 's2', 0)['saved']['0_3'] != result(runs, 's2', 1)['saved']['0_3']  # (the processes' states differ)

def test_written_by_2_processes_it_resumes_on_1_sharded_or_not_with_the_same_weights(runs):
    "Resharded by DCP: on 1 process (sharded on it, or a plain model) the final weights equal the 2-process run's (to float rounding)"
    for name in ('r1', 'p1'):
        assert_same(weights(runs, name), weights(runs, 's2'))
        r = result(runs, name)
        assert r['loaded'] == result(runs, 's2', 0)['saved']['0_3']  # the main process's random state, with a warning saying so
        assert any('was written by 2 process(es) and resumes on 1' in w for w in r['warnings'])

def test_written_by_1_process_sharded_or_not_it_resumes_on_2_with_the_same_weights(runs):
    "A 1-process sharded checkpoint (a folder) and a plain run's file both resume on 2 sharded processes to the 1-process run's weights"
    assert_same(weights(runs, 's1'), weights(runs, 's2'))
    assert_same(weights(runs, 'r21'), weights(runs, 's1'))
    assert [p.name for p in checkpoints(runs/'cp')][0] == f'{MID}.pt'  # not sharded: files, as before
    assert_same(weights(runs, 'rp2'), weights(runs, 'ps'))
    for rank in (0, 1): assert result(runs, 'r21', rank)['loaded'] == result(runs, 's1')['saved']['0_3']

def test_a_sharded_checkpoint_gathers_into_one_file_the_unsharded_model_loads(runs, tmp_path):
    "`consolidate_checkpoint` (one process, no process group) and `save_full_weights` (live, every process) give the final weights"
    final = weights(runs, 's2')
    f = consolidate_checkpoint(checkpoints(runs/'c2')[-1], tmp_path/'model.pt')
    model = GPT(32, n_layer=2, n_head=2, d_model=16, block_size=8)
    model.load_state_dict(torch.load(f, weights_only=True))  # strict: every key, every shape
    assert_same({k: v for k, v in model.state_dict().items()}, final, exact=True)
    assert_same(torch.load(runs/'e2.full.pt', weights_only=True), final, exact=True)

def test_a_sigterm_to_one_process_ends_both_preempted_after_a_complete_sharded_checkpoint_that_resumes_on_2_and_1(runs):
    "Process 1 alone gets SIGTERM in the 4th batch: both end 'preempted' after the sharded checkpoint of that point, which resumes to the uninterrupted run's weights"
    for rank in (0, 1): assert result(runs, 'pre', rank)['outcome'] == 'preempted'
    assert [p.name for p in checkpoints(runs/'cpre')] == [MID] and folder_problem(runs/'cpre'/MID) is None
    assert sorted(os.listdir(runs/'cpre'/MID)) == ['.metadata', '__0_0.distcp', '__1_0.distcp', 'rng_0.pt', 'rng_1.pt', 'state.pt']
    assert_same(weights(runs, 'rpre2'), weights(runs, 's2'), exact=True)
    assert_same(weights(runs, 'rpre1'), weights(runs, 's2'))

def test_a_process_killed_while_writing_leaves_the_previous_checkpoint_the_newest_complete(tmp_path):
    """Process 1 is killed (SIGKILL) at the 2nd checkpoint after writing its shards, before the processes agree it is complete: the
    checkpoint stays in its hidden temporary folder, which `last_checkpoint` skips with a warning; the 1st is the newest complete one"""
    log, rc = launch(tmp_path, 2, f'kill:k:{tmp_path}/ck:2')
    assert rc != 0 and 'SIGKILL' in log, log[-3000:]
    assert [p.name for p in checkpoints(tmp_path/'ck')] == ['checkpoint_0000_000002']
    with pytest.warns(UserWarning, match=r'skipped unfinished sharded checkpoint\(s\).*\.checkpoint_0000_000004\.tmp'):
        assert last_checkpoint(tmp_path/'ck').name == 'checkpoint_0000_000002'
    assert (tmp_path/'k.killed').read_text() == str(tmp_path/'ck'/'.checkpoint_0000_000004.tmp')
    assert folder_problem(tmp_path/'ck'/'.checkpoint_0000_000004.tmp').endswith('before every process had written its part')

def test_a_folder_missing_a_process_part_or_unfinished_is_refused_naming_it(tmp_path):
    "On one process: a folder without one process's random state, or a hidden unfinished one, is no checkpoint to `load` or `last_checkpoint`"
    from torch import nn
    from aisaac.dcp import ShardedCheckpointEngine
    from aisaac.persist import CheckpointEngine, CheckpointError
    p = ShardedCheckpointEngine().save({'model': nn.Linear(2, 2).state_dict(), 'opt': None, 'rng': {}, 'epoch': 0}, tmp_path/'checkpoint_0000_000001')
    assert folder_problem(p) is None
    CheckpointEngine().save({**torch.load(p/'state.pt', weights_only=True), 'world_size': 2}, p/'state.pt')  # as if 2 processes wrote it
    assert folder_problem(p).endswith("lacks rng_1.pt of its 2 processes: it is no complete sharded checkpoint")
    with pytest.raises(CheckpointError, match=r"lacks rng_1\.pt.*`last_checkpoint` skips it"): ShardedCheckpointEngine().load(p)
    with pytest.raises(CheckpointError, match='None of the 1 checkpoints'): last_checkpoint(tmp_path)
    p.rename(tmp_path/'.checkpoint_0000_000001.tmp')
    with pytest.raises(CheckpointError, match='unfinished sharded checkpoint'): ShardedCheckpointEngine().load(tmp_path/'.checkpoint_0000_000001.tmp')

def test_a_failure_to_complete_the_folder_is_an_error_and_leaves_the_previous_one_whole(tmp_path):
    "On one process: the rename that completes the folder fails (a full disk, say): `CheckpointWriteError` naming it; the folder of the earlier save of that name is whole"
    from unittest import mock
    from torch import nn
    from aisaac.dcp import ShardedCheckpointEngine
    from aisaac.persist import CheckpointWriteError
    state = {'model': nn.Linear(2, 2).state_dict(), 'opt': None, 'rng': {}, 'epoch': 0}
    p = ShardedCheckpointEngine().save(state, tmp_path/'checkpoint_0000_000001')
    real = os.replace
    def replace(src, dst):  # fails for the rename of the new folder only
        if Path(src).name == '.checkpoint_0000_000001.tmp': raise OSError(28, 'No space left on device')
        return real(src, dst)
    with mock.patch('aisaac.dcp.os.replace', replace):
        with pytest.raises(CheckpointWriteError, match=r'Could not complete the sharded checkpoint .*checkpoint_0000_000001: \[Errno 28\] No space'):
            ShardedCheckpointEngine().save({**state, 'epoch': 1}, p)
    assert folder_problem(p) is None and torch.load(p/'state.pt', weights_only=True)['epoch'] == 0
    assert last_checkpoint(tmp_path) == p

def fsdp_jobs(out):
    "`fsdp_runs`'s 2-process jobs"
    return [f'fstraight:f2:{out}/c2:2', f'fresume:fr2:{out}/c2/{MID}:2', f'fpreempt:fpre:{out}/cpre:2', f'fresume:frpre2:{out}/cpre/{MID}:2',
            f'faccum:fa:{out}/ca:2:2 steps', f'fresume:fra:{out}/ca/{MID}:2:accum', f'fbest:fb:{out}/cb:2', f'fpreempt:fpa3:{out}/cpa3:2:accum3',
            f'faccum:fa3s:{out}/ca3s:2:3 steps:accum3', f'fresume:frpa3:{out}/cpa3/checkpoint_0001_000001:2:accum3', f'fresume:wide:{out}/c2/{MID}:2:wide',
            f'faccum:fa3:{out}/ca3:2:3 batches']

@pytest.fixture(scope='module')
def fsdp_runs(dcp_dirs):
    """The same runs with FSDPCB, which shards the model in the fit (not by hand): uninterrupted (f2), resumed after 4 steps on 2 (fr2)
    and on 1 plain process (fp1); preempted by a SIGTERM to process 1 (fpre), resumed on 2 (frpre2) and 1 (frpre1); with GradAccumCB(2),
    checkpoints every 2 steps (fa, resumed: fra) and every 3 batches (fa3, inside a window); SaveBestModelCB (fb); with GradAccumCB(3),
    preempted (fpa3) and resumed (frpa3), and uninterrupted (fa3s); a GPT twice as wide resuming c2's checkpoint (wide)"""
    return dcp_dirs[1]

def test_fsdpcb_writes_sharded_checkpoints_and_resumes_from_them_to_the_uninterrupted_weights(fsdp_runs, runs):
    """A fit with FSDPCB and CheckpointCB writes folders (the model is sharded when they are written); a new fit with FSDPCB resumes
    the one after 4 steps to the uninterrupted run's weights exactly (before, FSDPCB refused a resumed fit), and a plain model on one
    process to them within float rounding (its gradients are summed in another order); FSDPCB's steps are those of sharding by hand"""
    out = fsdp_runs
    assert [p.name for p in checkpoints(out/'c2')] == [p.name for p in checkpoints(runs/'c2')]
    assert sorted(os.listdir(out/'c2'/MID)) == ['.metadata', '__0_0.distcp', '__1_0.distcp', 'rng_0.pt', 'rng_1.pt', 'state.pt']
    assert_same(weights(out, 'f2'), weights(runs, 's2'), exact=True)
    assert_same(weights(out, 'fr2'), weights(out, 'f2'), exact=True)
    for rank in (0, 1): assert result(out, 'fr2', rank)['loaded'] == result(out, 'f2', rank)['saved']['0_3']
    assert_same(weights(out, 'fp1'), weights(out, 'f2'))
    assert not torch.equal(weights(out, 'fp1')['head.weight'], weights(out, 'f2')['head.weight'])  # (the tolerance is needed)

def test_a_sigterm_to_one_process_of_an_fsdpcb_fit_ends_both_preempted_after_a_checkpoint_that_resumes(fsdp_runs, runs):
    "PreemptionCB under FSDPCB: process 1 alone gets SIGTERM; both end 'preempted' after a complete sharded checkpoint, which resumes with FSDPCB on 2 (exact) and plain on 1"
    out = fsdp_runs
    for rank in (0, 1): assert result(out, 'fpre', rank)['outcome'] == 'preempted'
    assert [p.name for p in checkpoints(out/'cpre')] == [MID] and folder_problem(out/'cpre'/MID) is None
    assert_same(weights(out, 'frpre2'), weights(runs, 's2'), exact=True)
    assert_same(weights(out, 'frpre1'), weights(runs, 's2'))

def test_under_fsdpcb_accumulation_resumes_exactly_from_window_ends_and_refuses_a_checkpoint_inside_a_window(fsdp_runs):
    """GradAccumCB(2) under FSDPCB: a checkpoint every 2 steps (at a window's end) resumes to the same weights exactly. One every 3
    batches falls inside a window, whose gradients FSDP holds unreduced on each process: refused on both, naming the fix, nothing
    written (before, it was written without them, and the resumed weights differed by up to 0.05)"""
    out = fsdp_runs
    assert_same(weights(out, 'fra'), weights(out, 'fa'), exact=True)
    errors = [result(out, 'fa3', rank)['error'] for rank in (0, 1)]
    for e in errors:
        assert 'CheckpointError: A checkpoint after batch 1 of the 2 of an accumulation window of a sharded model' in e
        assert "Checkpoint at the ends of windows: `CheckpointCB(every='N steps')`, or `every_n_batches` a multiple of 2" in e
    assert checkpoints(out/'ca3') == []

def test_save_best_model_under_fsdpcb_saves_and_loads_back_the_whole_weights(fsdp_runs):
    """SaveBestModelCB(greater_is_better=True) on a loss that goes down: the best is epoch 0, on both processes. Its file holds the whole
    weights (every process joins the gather; before, the main process's shards as DTensors), those of the checkpoint after epoch 0, and the
    model ends with them loaded back into its shards"""
    out = fsdp_runs
    assert [result(out, 'fb', r)['best_epoch'] for r in (0, 1)] == [0, 0]
    assert result(out, 'fb', 0)['best'] == result(out, 'fb', 1)['best']
    best = torch.load(out/'cb'/'best.pt', weights_only=True)
    model = GPT(32, n_layer=2, n_head=2, d_model=16, block_size=8)
    model.load_state_dict(best)  # strict: every key, every shape, plain tensors
    epoch0 = torch.load(consolidate_checkpoint(out/'c2'/'checkpoint_0000_000008', out/'epoch0.pt'), weights_only=True)
    assert_same(best, epoch0, exact=True)
    assert_same(weights(out, 'fb'), epoch0, exact=True)
    assert not torch.equal(weights(out, 'f2')['head.weight'], epoch0['head.weight'])

def test_a_preemption_inside_an_accumulation_window_of_an_fsdpcb_fit_checkpoints_at_the_window_end(fsdp_runs):
    """GradAccumCB(3), 8 batches an epoch: process 1 gets SIGTERM in the 7th batch; the processes agree on it at the epoch's end, inside
    a window. PreemptionCB waits for the window's end (the 1st batch of epoch 1), both end 'preempted', and the checkpoint resumes to
    the uninterrupted run's weights exactly (before: the checkpoint was refused and the fit ended on the error)"""
    out = fsdp_runs
    for rank in (0, 1): assert result(out, 'fpa3', rank)['outcome'] == 'preempted' and 'error' not in result(out, 'fpa3', rank)
    assert [p.name for p in checkpoints(out/'cpa3')] == ['checkpoint_0001_000001']
    assert_same(weights(out, 'frpa3'), weights(out, 'fa3s'), exact=True)

def test_fsdpcb_refuses_a_checkpoint_of_another_model_before_sharding_on_every_process(fsdp_runs):
    "A GPT twice as wide resumes the sharded checkpoint with FSDPCB: `check_fit` compares the folder's whole shapes with the unsharded model's and refuses it on both processes, the model left unsharded"
    for rank in (0, 1):
        r = result(fsdp_runs, 'wide', rank)
        assert "CheckpointError: The checkpoint does not fit this trainer: shapes differ: tok_emb.weight (32, 16) (the model's: (32, 32))" in r['error'], r['error']
        assert r['param_type'] == 'Parameter'

def test_aisaac_collectives_keep_to_nccl_and_a_checkpoint_period_of_steps_needs_none(background):
    """NCCL, the backend of every GPU run, refuses a CPU tensor in the default process group, and aisaac put its own CPU tensors there:
    the agreement that every process wrote its part of a sharded checkpoint, CheckpointCB's decision on a period, SaveBestModelCB's.
    Under dcp_run's stand-in for NCCL's rule (AISAAC_NCCL_RULE) they now run, in a gloo group of their own. And CheckpointCB
    broadcasts the main process's decision at each training batch only for a period the processes count apart (time, samples,
    tokens): 8 broadcasts in a run of 8 batches on a wall-clock period, none every '4 steps' (before: 8 in both)"""
    tmp_path = background/'rule'  # (its jobs run in `background`'s launch, under the same rule)
    assert [p.name for p in checkpoints(tmp_path/'s')] == ['checkpoint_0000_000004', 'checkpoint_0000_000008'] and not (tmp_path/'c').exists()
    for r in (0, 1):
        assert result(tmp_path, 'steps', r)['broadcasts'] == 0 and result(tmp_path, 'clock', r)['broadcasts'] == 8
        assert result(tmp_path, 'best', r)['best_epoch'] == 0 and result(tmp_path, 'best', r)['broadcasts'] == 2  # (one an epoch)

def logs_jobs(out):
    "The jobs of the logs' test (2 processes)"
    return [f'flogs:u:{out}/cu:2', f'flogs:r8:{out}/c8:2:{out}/cu/checkpoint_0000_000008:u', f'flogs:r12:{out}/c12:2:{out}/cu/checkpoint_0001_000004:u']

@pytest.fixture(scope='module')
def logs(dcp_dirs):
    "The folder of the logs' test's jobs (run in `dcp_dirs`'s first launch)"
    return dcp_dirs[2]

def test_an_fsdpcb_run_resumed_on_2_processes_writes_the_logs_of_the_uninterrupted_run(logs):
    """MetricsCB, CSVLogger, JSONLinesLogger and ResultsFileCB in an FSDPCB fit of 2 epochs with a checkpoint every 4 steps; the run
    resumed from the checkpoint at the end of epoch 0's training (r8) and from the one in the middle of epoch 1 (r12), each in the
    files the uninterrupted run left (as an interrupted run leaves them, past the checkpoint): the CSV and JSON lines end as the
    uninterrupted run's, byte for byte, and the results file has its events. Before, the loggers, switched off on rank 1, still
    loaded their state there, and the next sharded checkpoint's `state_dict` flushed the CSV logger on rank 1, rewriting the main
    process's file with the checkpoint's rows: r8's CSV was 'epoch' and the row of epoch 1 ('epoch\\n1,3.43...'), the header and
    epoch 0 gone. And ResultsFileCB's `state_dict` raised AttributeError on rank 1 (no run started there): the fit hung"""
    tmp_path = logs
    csv, lines = (tmp_path/'u.csv').read_text(), (tmp_path/'u.jsonl').read_text()
    assert csv.splitlines()[0] == 'epoch,train_loss,valid_loss' and len(csv.splitlines()) == 3, csv
    assert len(lines.splitlines()) == 2, lines
    events = lambda name: [(e['event'], e.get('epoch'), e.get('metrics')) for e in map(json.loads, (tmp_path/f'{name}.results.jsonl').read_text().splitlines())]
    assert [e[0] for e in events('u')] == ['run_start', 'epoch', 'epoch', 'run_stop']
    for name in ('r8', 'r12'):
        for r in (0, 1): assert 'error' not in result(tmp_path, name, r), result(tmp_path, name, r)
        assert (tmp_path/f'{name}.csv').read_text() == csv, name
        assert (tmp_path/f'{name}.jsonl').read_text() == lines, name
        assert events(name) == events('u'), name

# ------------------------------------------------------------------------------------------------ written in the background

@pytest.fixture(scope='module')
def background(tmp_path_factory):
    """On 2 processes, under dcp_run's stand-in for NCCL's rule (no CPU tensor of aisaac's in the default group): the straight run with
    `CheckpointCB(background=True)` (b2), its checkpoint after 4 steps resumed (rb2); the same with each process holding its part of the
    first checkpoint for 3 training batches (bh); and with process 1 failing to write its part of the second (bf)"""
    out = tmp_path_factory.mktemp('dcp_background')
    (rule := out/'rule').mkdir()  # and the jobs of test_aisaac_collectives_keep_to_nccl_..., under the same rule, writing there
    ok(out, 2, f'@{rule}', f'fstraight:steps:{rule}/s:1', f'fstraight:clock:{rule}/c:1:1000 s', f'fbest:best:{rule}/b:2', f'@{out}',
       f'background:b2:{out}/cb2:2', f'resume:rb2:{out}/cb2/{MID}:2', f'background:bh:{out}/cbh:2:held', f'background:bf:{out}/cbf:2:fails',
       env={'AISAAC_NCCL_RULE': '1'})
    return out

def test_sharded_checkpoints_written_in_the_background_are_the_synchronous_ones_and_resume_exactly(runs, background):
    "Each folder (DCP's `async_save` for the shards) holds what the synchronous run's holds at the same point: the same whole weights, "
    "random states and state; resumed on 2, the run ends on the uninterrupted run's weights exactly"
    names = [p.name for p in checkpoints(background/'cb2')]
    assert names == [p.name for p in checkpoints(runs/'c2')] and sorted(os.listdir(background/'cb2')) == names  # no temporary folder left
    for name in names:
        a, b = (consolidate_checkpoint(d/name, background/f'{d.name}-{name}.pt') for d in (runs/'c2', background/'cb2'))
        assert_same(torch.load(a, weights_only=True), torch.load(b, weights_only=True), exact=True)
        for f in ('rng_0.pt', 'rng_1.pt'):  # each process's torch random state (Python's and NumPy's are not seeded by dcp_run)
            ra, rb = (torch.load(d/name/f, weights_only=True) for d in (runs/'c2', background/'cb2'))
            assert torch.equal(ra['torch'], rb['torch']), (name, f)
        sa, sb = (torch.load(d/name/'state.pt', weights_only=True) for d in (runs/'c2', background/'cb2'))
        sa['clock'].pop('seconds'); sb['clock'].pop('seconds')
        for k in ('epoch', 'batch', 'callbacks', 'history', 'clock', 'opt', 'world_size'): assert str(sa[k]) == str(sb[k]), (name, k)
    assert_same(weights(background, 'b2'), weights(runs, 's2'), exact=True)
    assert_same(weights(background, 'rb2'), weights(runs, 's2'), exact=True)
    for rank in (0, 1): assert result(background, 'rb2', rank)['loaded'] == result(runs, 's2', rank)['saved']['0_3']

def test_both_processes_train_on_while_a_sharded_checkpoint_is_written_in_the_background(background):
    "Each process holds its part of the first checkpoint before the agreement: both take 3 more training steps meanwhile, with the "
    "checkpoint still under way at each, then it completes; the collectives of the two threads never meet"
    for rank in (0, 1):
        r = result(background, 'bh', rank)
        assert r['during'] == [[5, True], [6, True], [7, True]] and r['outcome'] == 'ok', r
    assert all(folder_problem(p) is None for p in checkpoints(background/'cbh')) and len(checkpoints(background/'cbh')) == 4

def test_a_sharded_write_that_fails_in_the_background_on_one_process_ends_both_at_the_next_step(background):
    "Process 1 cannot write its part of the checkpoint after step 8: both processes raise at the same step, the first after the "
    "write failed (before the next checkpoint, at step 12), the folder is left unfinished, and the one before stays the newest complete one"
    for rank in (0, 1):
        r = result(background, 'bf', rank)
        assert 'Could not write the sharded checkpoint' in r['error'] and 'checkpoint_0000_000008' in r['error'], r['error']
        # `at_error` is the last step that completed: 8 when the write had already failed when step 9 began (a fast machine), more when it failed later
        assert 8 <= r['at_error'] <= 12 and r['outcome'] == 'error', r
    assert result(background, 'bf', 0)['at_error'] == result(background, 'bf', 1)['at_error']
    assert [p.name for p in checkpoints(background/'cbf')] == [MID]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        assert last_checkpoint(background/'cbf') == background/'cbf'/MID
    assert any('.checkpoint_0000_000008.tmp' in str(x.message) for x in w)
