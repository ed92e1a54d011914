"""The outer restart loop (scripts/relaunch.py) on a 2-process run (torchrun, gloo, DDP): a process killed once, the run
started again resumes from `last_checkpoint` and ends with the weights of the run that was never interrupted.

The run is bench/chaos.py's (`--child --procs 2`): a seeded MLP, `CheckpointCB` every 5 steps, `resume_from=last_checkpoint`,
its final weights and optimizer state in `final.pt`."""
import importlib.util, os, signal, subprocess, sys
from pathlib import Path
import pytest, torch

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location('relaunch', ROOT/'scripts'/'relaunch.py')
relaunch = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(relaunch)
STEPS, LIMIT = 240, 300

def run_cmd(out):
    "The 2-process training run, writing to `out`"
    return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', str(ROOT/'bench'/'chaos.py'),
            '--child', str(out), '--steps', str(STEPS), '--procs', '2']

def relaunched(out, max_restarts):
    "scripts/relaunch.py running the run, in its own process group"
    cmd = [sys.executable, str(ROOT/'scripts'/'relaunch.py'), '--max-restarts', str(max_restarts), '--dir', str(out/'ckpt'), '--', *run_cmd(out)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

def wait(p):
    "The output of `p`, once it ended (killed with its group past `LIMIT`)"
    try: return p.communicate(timeout=LIMIT)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail(f"the run did not end in {LIMIT} s:\n{p.communicate()[0][-3000:]}")

def same(a, b):
    "Nested dicts and lists of tensors and numbers, equal bit for bit"
    if isinstance(a, torch.Tensor): return torch.equal(a, b)
    if isinstance(a, dict): return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)): return len(a) == len(b) and all(map(same, a, b))
    return a == b

def test_a_run_killed_once_is_started_again_and_ends_as_if_never_stopped(tmp_path):
    ref, out = tmp_path/'reference', tmp_path/'killed'
    log = wait(relaunched(ref, 0))
    assert (ref/'final.pt').exists(), log[-3000:]
    p = relaunched(out, 2)
    seen = []
    for line in p.stdout:  # the run's progress (bench/chaos.py's child prints `step N` after each training batch)
        seen.append(line)
        if line.startswith('step ') and int(line.split()[1]) >= 23: break  # the checkpoint of step 20 is written
    else: pytest.fail('the run ended before step 23:\n' + ''.join(seen)[-3000:])
    os.kill(int((out/'pid_1').read_text()), signal.SIGKILL)  # process 1 dies; torchrun stops process 0 and exits with an error
    log = ''.join(seen) + wait(p)
    assert p.returncode == 0, log[-3000:]
    starts = [l for l in log.splitlines() if l.startswith('>>> relaunch: start')]
    assert len(starts) == 2 and ', from checkpoint_' in starts[1], log[-3000:]  # one restart, which resumed a checkpoint
    a, b = (torch.load(d/'final.pt', weights_only=True) for d in (ref, out))
    assert same(a['model'], b['model']) and same(a['opt'], b['opt']) and same(a['history'], b['history'])

def test_a_failure_that_a_restart_does_not_cure_is_not_retried(tmp_path):
    "A command that fails before any checkpoint: no progress, so one start only (with `--dir`); without it, every restart"
    fail = [sys.executable, '-c', 'raise SystemExit(3)']
    lines = []
    assert relaunch.relaunch(fail, max_restarts=5, dir=tmp_path, say=lines.append) == 3
    assert len([l for l in lines if ': start' in l]) == 1 and 'not started again' in lines[-1], lines
    lines.clear()
    assert relaunch.relaunch(fail, max_restarts=2, say=lines.append) == 3
    assert len([l for l in lines if ': start' in l]) == 3 and 'gave up after 2' in lines[-1], lines
