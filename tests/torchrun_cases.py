"""Run a test script's case on 2 CPU processes with torchrun, under a time limit: what tests/test_ranks.py, tests/test_sharding.py and
the other 2-process tests share. `Cases` runs all the cases the selected tests read, of every module, in one launch (tests/torchrun_batch.py):
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
    "Mark a test as reading these cases of its module's `TORCHRUN_CASES` (only the cases some selected test uses are run)"
    return pytest.mark.torchrun_cases(*names)

_runs = {}  # (script, case) -> (its OUT folder, the launch that ran it): the cases run in this session

class _Launch:
    "One torchrun launch of tests/torchrun_batch.py for `plan`'s cases (`[script, OUT, args...]` each): its return code and log"
    def __init__(self, plan:list, root:Path):
        for _, out, *_ in plan: out.mkdir(parents=True, exist_ok=True)
        (root/'plan.json').write_text(json.dumps([[str(a) for a in c] for c in plan]))
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', str(Path(__file__).parent/'torchrun_batch.py'),
               str(root/'plan.json')]
        names = ', '.join(f'{Path(c[0]).stem}:{c[2] if len(c) > 2 else ""}' for c in plan)
        self.rc, self.log = _run(cmd, names, LIMIT + 60 * len(plan))
        if _retry(self.rc, self.log):  # (as in `launch`), from scratch
            for _, out, *_ in plan: shutil.rmtree(out, ignore_errors=True); out.mkdir(parents=True)
            self.rc, self.log = _run(cmd, names, LIMIT + 60 * len(plan))

class Cases:
    """The cases of `script` (`table`: a case's name -> the script's arguments after OUT) that a module's tests read, each with its own
    OUT folder (`out(name)`). The first read in a session runs, in one torchrun launch, every case that a selected test of any module
    marks with `uses`: a module names its script and cases in `TORCHRUN_CASES = (script, table)`, and its `cases` fixture makes
    `Cases(request, *TORCHRUN_CASES)`"""
    def __init__(self, request, script:Path, table:dict): self.request, self.script, self.table = request, Path(script), table
    def out(self, name): return _runs[(str(self.script), name)][0]
    def _launch(self, name):
        "Run this module's case `name` and every case a selected test marks with `uses` that has not run, in one launch"
        session, plan, keys = self.request.session, [], []
        root = self.request.getfixturevalue('tmp_path_factory').mktemp('torchrun')
        wanted = [(self.script, self.table, name)] + [(Path(spec[0]), spec[1], n) for it in session.items
                  if (spec := getattr(it.module, 'TORCHRUN_CASES', None)) for m in it.iter_markers('torchrun_cases') for n in m.args]
        for script, table, n in wanted:
            if (str(script), n) in _runs: continue
            assert n in table, f'{n!r} is not a case of {script.name} ({sorted(table)})'
            out = root/f'{script.stem}-{n}'
            keys.append((str(script), n))
            plan.append([script, out, *table[n]])
            _runs[keys[-1]] = (out, None)
        launch = _Launch(plan, root)
        for key, (_, out, *_) in zip(keys, plan): _runs[key] = (out, launch)
    def __call__(self, name):
        "Each process's result of the case `name`"
        if (str(self.script), name) not in _runs: self._launch(name)
        out, launch = _runs[(str(self.script), name)]
        if launch is None: pytest.fail(f'the launch of the case {name!r} failed (an earlier test says how)')
        errors = [f.read_text() for f in sorted(out.glob('batch_error_*.txt'))]
        assert not errors, '\n'.join(errors)[-4000:]
        missing = [r for r in range(2) if not (out/f'result_{r}.json').exists()]
        assert not missing, f'case {name!r}: no result from rank(s) {missing}\n' + launch.log[-4000:]
        assert launch.rc == 0, launch.log[-4000:]
        return [json.loads((out/f'result_{r}.json').read_text()) for r in range(2)]
