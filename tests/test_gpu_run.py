"""The GPU run cannot lose a figure (issue 48), checked on the CPU: bench/gpu_run.sh's dry run (`DRY=1`: every step runs its CPU
part: the cuda tests skip, the graphs tables say "GPU only", the page runs without its `cuda` and `hide` cells) leaves every step's
file and a summary of them all, written first and appended to; bench/gpu_nb.py goes on past a failing cell and writes the page, with
the cells that ran, when it is stopped; pytest's per-test limit is below the step's."""
import json, os, re, subprocess, sys, textwrap
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT/'bench'/'gpu_run.sh'

def test_the_dry_run_leaves_every_steps_file_and_one_summary(tmp_path):
    "The default steps (tests, graphs 4a, 4b and 4c one process each, nb): each file there, each step in the summary with its exit status"
    pytest.importorskip('execnb', reason="execnb (nbdev's notebook runner, which bench/gpu_nb.py runs the page with) is not installed")
    env = {**os.environ, 'DRY': '1', 'OUT': str(tmp_path), 'PYTHON': sys.executable}
    r = subprocess.run(['bash', str(RUN)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    files = {p.name for p in tmp_path.iterdir()}
    want = {'summary.md', 'env.txt', 'cuda_tests.txt', 'cuda_tests.xml', 'graphs_4a.txt', 'graphs_4b.txt', 'graphs_4c.txt', 'gpu_nb.txt', 'gpu.ipynb'}
    assert want <= files, (want - files, files)
    summary = (tmp_path/'summary.md').read_text()
    assert summary.startswith('# aisaac on a GPU: bench/gpu_run.sh (DRY') and 'aisaac.all imports' in summary and 'ended at +' in summary, summary
    for step, file in [('tests', 'cuda_tests.txt'), ('graphs 4a', 'graphs_4a.txt'), ('graphs 4b', 'graphs_4b.txt'), ('graphs 4c', 'graphs_4c.txt'), ('nb', 'gpu_nb.txt')]:
        assert re.search(rf'^## {step}: exit 0, \d+ s, {file}$', summary, re.M), (step, summary)
    assert re.search(r'\d+ skipped', (tmp_path/'cuda_tests.txt').read_text()) and '<testsuite' in (tmp_path/'cuda_tests.xml').read_text()
    for t in ('4a', '4b', '4c'): assert (tmp_path/f'graphs_{t}.txt').read_text().strip().startswith(f'## {t}. whole-step CUDA graphs: GPU only')
    cells = [c for c in json.loads((tmp_path/'gpu.ipynb').read_text())['cells'] if c['cell_type'] == 'code']
    assert 'no GPU here' in ''.join(''.join(o.get('text', '')) for c in cells for o in c.get('outputs', []))
    print(sorted(files))

def _nb(cells, path):
    nb = {'cells': [{'cell_type': 'code', 'execution_count': None, 'id': f'c{i}', 'metadata': {}, 'outputs': [], 'source': s} for i, s in enumerate(cells)],
          'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}
    path.write_text(json.dumps(nb))
    return path

def test_the_page_keeps_the_cells_that_ran_past_a_failure_and_a_stop(tmp_path):
    "A failing cell: its error is its output, the next cells run. A stop (SIGTERM, as `timeout` sends): the cell running gets it, the rest are "
    "left out, and the page is written with what ran; the exit status says which"
    pytest.importorskip('execnb', reason="execnb is not installed")
    nb = _nb(["print('one')", "raise ValueError('a cell that fails')", "print('three')",
              "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\nimport time; time.sleep(30)", "print('never')"], tmp_path/'nb.ipynb')
    r = subprocess.run([sys.executable, str(ROOT/'bench'/'gpu_nb.py'), str(nb), str(tmp_path/'out.ipynb')], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr  # (stopped)
    assert '4 cells ran, 2 failed' in r.stdout and 'the run was SIGTERM' in r.stdout and 'ValueError: a cell that fails' in r.stdout, r.stdout
    outs = [[(o.get('text') and ''.join(o['text'])) or o.get('ename') for o in c['outputs']] for c in json.loads((tmp_path/'out.ipynb').read_text())['cells']]
    assert outs[0] == ['one\n'] and outs[1] == ['ValueError'] and outs[2] == ['three\n'] and outs[3] == ['Stopped'] and outs[4] == [], outs

def test_a_hanging_test_fails_alone_before_the_step_is_stopped():
    "pytest's per-test limit (`--timeout`, T_TEST) is below the tests step's (T_TESTS): a hang costs one test, and the step still writes its report"
    src = RUN.read_text()
    per_test, step = (int(re.search(rf'\${{{k}:-(\d+)}}', src).group(1)) for k in ('T_TEST', 'T_TESTS'))
    assert per_test < step / 2, (per_test, step)
    assert 'timeout -s INT' in src  # (the step's limit is an interrupt, after which pytest writes its summary and JUnit XML)
