"""Run a test script's case on 2 CPU processes with torchrun, under a time limit: what tests/test_ranks.py, tests/test_sharding.py and
the other 2-process tests share. `Cases` runs all the cases a module's selected tests read in one launch (tests/torchrun_batch.py):
each launch costs torchrun's start and two imports of torch and aisaac, several seconds on 2 loaded cores, more than most cases."""
import json, os, shutil, signal, subprocess, sys
from pathlib import Path
import pytest

LIMIT = 600  # seconds for a run of 2 processes: a guard against a hang (each case ends in a few seconds once started, a minute on a loaded machine)

def _run(cmd, case, limit=LIMIT):
    "Run `cmd` (torchrun) under `limit`: its return code and log"
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try: log, _ = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # torchrun and both processes
        p.communicate()
        pytest.fail(f"the case {case!r} did not end in {limit} s: a process waits for the other")
    return p.returncode, log

def _retry(rc, log): return rc != 0 and 'terminate called without an active exception' in log

def launch(script:Path, out:Path, case:str, *args):
    "Run `script`'s `case` on 2 processes; each process's result (`out/result_<rank>.json`), or a failure when the run outlives `LIMIT`"
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', str(script), str(out), case, *args]
    rc, log = _run(cmd, case)
    if _retry(rc, log):  # gloo's threads torn down at a process's exit (torch's
        rc, log = _run(cmd, case)  # known abort at interpreter finalization, seen in 1 of ~5 runs on the loaded 2 cores): once more
    assert rc == 0, log[-4000:]
    return [json.loads((out/f'result_{r}.json').read_text()) for r in range(2)]

def uses(*names):
    "Mark a test as reading these cases of its module's `Cases` (only the cases some selected test uses are run)"
    return pytest.mark.torchrun_cases(*names)

class Cases:
    """The cases of `script` (`table`: a case's name -> the script's arguments after OUT) that the selected tests of `request`'s module
    (of the session, for a session's fixture) mark with `uses`, all run in one torchrun launch when a test first reads one; each case has its own OUT folder, `out(name)`"""
    def __init__(self, request, script:Path, table:dict):
        mine = (lambda it: True) if request.scope == 'session' else (lambda it: it.module is request.module)  # (a session's: every module's)
        used = {n for it in request.session.items if mine(it) for m in it.iter_markers('torchrun_cases') for n in m.args}
        self.script, self.table, self.names, self.ran = script, table, [n for n in table if n in used], False
        self.root = request.getfixturevalue('tmp_path_factory').mktemp(script.stem)
    def out(self, name): return self.root/name
    def _launch(self):
        for n in self.names:
            shutil.rmtree(self.out(n), ignore_errors=True)
            self.out(n).mkdir()
        plan = self.root/'plan.json'
        plan.write_text(json.dumps([[str(self.out(n)), *self.table[n]] for n in self.names]))
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', str(Path(__file__).parent/'torchrun_batch.py'),
               str(self.script), str(plan)]
        return _run(cmd, ', '.join(self.names), LIMIT + 60 * len(self.names))
    def __call__(self, name):
        "Each process's result of the case `name`"
        assert name in self.names, f'{name!r}: mark the test with torchrun_cases.uses({name!r})'
        if not self.ran:
            self.ran = True
            rc, log = self._launch()
            if _retry(rc, log): rc, log = self._launch()  # (as in `launch`)
            self.rc, self.log = rc, log
        errors = [f.read_text() for f in sorted(self.out(name).glob('batch_error_*.txt'))]
        assert not errors, '\n'.join(errors)[-4000:]
        missing = [r for r in range(2) if not (self.out(name)/f'result_{r}.json').exists()]
        assert not missing, f'case {name!r}: no result from rank(s) {missing}\n' + self.log[-4000:]
        assert self.rc == 0, self.log[-4000:]
        return [json.loads((self.out(name)/f'result_{r}.json').read_text()) for r in range(2)]
