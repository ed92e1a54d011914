"""The chaos harness (bench/chaos.py, issue 31) as tests: runs SIGKILLed at seeded points of their own progress, on one process and
on two, end bit-identical to an uninterrupted run, their log files included. A one-process run is forked from the harness (its
imports done once: `--quick` 21 s against 65 s with `--fresh`); `test_a_fresh_python_for_each_start` keeps the path of a new
interpreter for each start tried. Apart from tests/test_crash.py so that pytest-xdist
(`--dist loadfile`) runs these long tests beside the rest of it, not after it on the same worker."""
import json, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def chaos(tmp_path, *args):
    "Run bench/chaos.py with `args`: its figures and its printout"
    out = tmp_path/'chaos.json'
    p = subprocess.run([sys.executable, str(ROOT/'bench'/'chaos.py'), *args, '--json', str(out)], capture_output=True, text=True, timeout=1800)  # (a guard against a hang: the kills follow the run's progress, however slow)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(out.read_text())['figures'], p.stdout

def test_the_chaos_harness_quick_every_trial_ends_identical(tmp_path):
    "bench/chaos.py --quick: 3 trials of 2 SIGKILLs at seeded random instants; every trial ends bit-identical, logs included"
    f, stdout = chaos(tmp_path, '--quick')
    assert f['trials'] == 3 and f['kills'] >= 3, f
    assert f['identical'] == f['logs_identical'] == 3 and f['errors'] == 0, stdout
    assert f['csv_rows_lost'] == f['csv_rows_dup'] == f['jsonl_rows_lost'] == f['jsonl_rows_dup'] == 0, f
    assert f['checkpoints_unreadable'] == f['temps_left'] == 0, f

def test_the_chaos_harness_with_checkpoints_written_in_the_background_and_uploaded(tmp_path):
    "bench/chaos.py --background --upload --slow-write 0.1: 2 trials of 2 SIGKILLs of a run whose checkpoints are written by a "
    "background thread, then uploaded to a file:// URL, each 0.1 s slower; every restart deletes the local checkpoints and resumes "
    "from the newest whole upload (`last_checkpoint(url)`); kills fall during the writes and uploads; every trial ends bit-identical, no row lost"
    f, stdout = chaos(tmp_path, '--trials', '2', '--kills', '2', '--steps', '240', '--background', '--upload', '--slow-write', '0.1')
    assert f['trials'] == 2 and f['kills'] >= 2 and f['kills_in_a_write'] + f['kills_in_an_upload'] >= 1, f
    assert f['identical'] == f['logs_identical'] == 2 and f['errors'] == 0, stdout
    assert f['csv_rows_lost'] == f['csv_rows_dup'] == f['jsonl_rows_lost'] == f['jsonl_rows_dup'] == 0, f
    assert f['checkpoints_unreadable'] == f['temps_left'] == 0, f

def test_the_chaos_harness_on_two_processes(tmp_path):
    "bench/chaos.py --procs 2 --quick: torchrun, gloo, DDP; one process drawn at random is SIGKILLed twice; both restart from "
    "the newest checkpoint and end where the uninterrupted 2-process run ends"
    f, stdout = chaos(tmp_path, '--procs', '2', '--quick', '--steps', '240')
    assert f['identical'] == f['logs_identical'] == 1 and f['errors'] == 0 and f['kills'] >= 1, stdout

def test_a_fresh_python_for_each_start(tmp_path):
    "bench/chaos.py --fresh: each (re)start a new Python (the path before the forked starts): a trial of one SIGKILL ends identical"
    f, stdout = chaos(tmp_path, '--fresh', '--trials', '1', '--kills', '1', '--steps', '120')
    assert f['trials'] == 1 and f['kills'] >= 1 and f['identical'] == f['logs_identical'] == 1 and f['errors'] == 0, stdout
