"Run a test script's case on 2 CPU processes with torchrun, under a time limit: what tests/test_ranks.py and tests/test_sharding.py share."
import json, os, signal, subprocess, sys
from pathlib import Path
import pytest

LIMIT = 600  # seconds for a run of 2 processes: a guard against a hang (each case ends in a few seconds once started, a minute on a loaded machine)

def _run(cmd, case):
    "Run `cmd` (torchrun) under `LIMIT`: its return code and log"
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try: log, _ = p.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # torchrun and both processes
        p.communicate()
        pytest.fail(f"the case {case!r} did not end in {LIMIT} s: a process waits for the other")
    return p.returncode, log

def launch(script:Path, out:Path, case:str, *args):
    "Run `script`'s `case` on 2 processes; each process's result (`out/result_<rank>.json`), or a failure when the run outlives `LIMIT`"
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', str(script), str(out), case, *args]
    rc, log = _run(cmd, case)
    if rc != 0 and 'terminate called without an active exception' in log:  # gloo's threads torn down at a process's exit (torch's
        rc, log = _run(cmd, case)  # known abort at interpreter finalization, seen in 1 of ~5 runs on the loaded 2 cores): once more
    assert rc == 0, log[-4000:]
    return [json.loads((out/f'result_{r}.json').read_text()) for r in range(2)]
