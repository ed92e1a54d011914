#!/usr/bin/env python
"""Run notebooks in a real Jupyter kernel (nbclient) and save them with their outputs.

    python scripts/run_nbs.py                      # `make docs`: every notebook of nbs/, slow cells included
    python scripts/run_nbs.py nbs/tutorials        # a folder, or notebooks by path
    python scripts/run_nbs.py --skip-slow ...      # leave `#| slow` cells (and their saved outputs) alone
    python scripts/run_nbs.py --check ...          # run, save nothing: fails if a cell raises

nbdev-test runs notebooks in-process, without a kernel, so progress bars come out as text and nothing
is kept. Here each notebook runs in its own `python3` kernel of this environment, in the notebook's
folder, as a reader would run it: fastprogress draws HTML bars and tables, matplotlib makes PNGs,
`view_source_code` highlights. Cells flagged `#| eval: false` and export cells are not run, nor cells flagged `#| cuda` where
there is no GPU (bench/gpu_nb.py saves a page run on the GPU machine); notebooks
with `skip_exec: true` in their front matter and folders with a `.notest` file are skipped, as nbdev-test
does. A notebook is saved only when every cell ran, with the paths of this machine in its outputs made relative
(`aisaac/sft.py`, not the checkout's absolute path), temporary folders shown as `<tmp>`, warnings as `UserWarning: message`
(without the file, line and source line that raised them), then cleaned by `nbdev-clean`, which keeps the
outputs and drops what changes from run to run (execution counts, cell metadata, object ids).

The time of every notebook and of every slow cell is printed, so that a slow cell can tell the reader
how long it takes ("this cell trains on the full data: about 40 s here").
"""
import argparse, json, os, re, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT/'nbs'

def rel(p):
    "`p` relative to the repository when it is inside it"
    return p.relative_to(ROOT) if p.is_relative_to(ROOT) else p

def find_notebooks(paths):
    "Notebooks under `paths` (files or folders), skipping what nbdev-test skips"
    res = []
    for p in map(Path, paths or [NBS]):
        p = p.resolve()
        cands = [p] if p.suffix == '.ipynb' else sorted(p.rglob('*.ipynb'))
        for nb in cands:
            rel = nb.relative_to(NBS) if nb.is_relative_to(NBS) else Path(nb.name)
            if any(part.startswith(('_', '.')) for part in rel.parts) and nb != p: continue
            if any((d/'.notest').exists() for d in nb.parents if d.is_relative_to(NBS)): continue
            if re.search(r'^skip_exec:\s*true', first_markdown(nb), re.M): continue
            res.append(nb)
    return list(dict.fromkeys(res))

def first_markdown(nb):
    "The text of the notebook's raw front matter or first markdown cell (where `skip_exec` would be)"
    cells = json.loads(nb.read_text())['cells']
    c = next((c for c in cells if c['cell_type'] in ('raw', 'markdown')), None)
    return ''.join(c['source']) if c else ''

# The kernel's environment: the reader's, minus other libraries' progress bars (tqdm's, as `datasets` draws them),
# which would be saved as Jupyter widgets that the docs cannot show. fastprogress's HTML bars stay.
KERNEL_ENV = {**os.environ, 'TQDM_DISABLE': '1', 'HF_DATASETS_DISABLE_PROGRESS_BARS': '1', 'HF_HUB_DISABLE_PROGRESS_BARS': '1'}
KERNEL_ENV.pop('IN_TEST', None)
# The kernel imports this checkout's aisaac, also when the environment's editable install points to another
# checkout (a git worktree sharing one virtualenv).
KERNEL_ENV['PYTHONPATH'] = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])

def directives(src):
    "The `#| ...` lines at the top of a cell as {name: value}"
    res = {}
    for line in src.splitlines():
        if not line.startswith('#|'):
            if line.strip(): break
            continue
        body = line[2:].strip()
        if ':' in body: k, v = body.split(':', 1); res[k.strip()] = v.strip()
        else:
            for w in body.split(): res[w] = 'true'
    return res

def to_run(cell, skip_slow):
    "Whether `cell` is executed (as nbdev-test would, plus slow cells unless `skip_slow`)"
    if cell.cell_type != 'code' or not cell.source.strip(): return False
    d = directives(cell.source)
    if d.get('eval') == 'false' or 'nbdev_export(' in cell.source: return False
    if 'cuda' in d and not has_cuda(): return False  # a GPU-only cell: its saved outputs (from a GPU run, bench/gpu_nb.py) stay
    return not (skip_slow and 'slow' in d)

def has_cuda():
    "Whether this machine's torch sees a CUDA GPU (cells flagged `cuda` run only there)"
    import torch
    return torch.cuda.is_available()

# In place of a skipped slow cell, a check can run this: it draws from every random generator, as the slow cell's training
# would. A cell after it whose outputs change then depends on whether the slow cells ran (it should seed itself).
DRAW = "import random as _r, numpy as _np, torch as _t; _r.random(); _np.random.rand(); _t.rand(1); del _r, _np, _t"

# The pages tests/test_notebooks.py re-runs in a kernel beside pytest-xdist's other worker (its FAST) and compares with their saved
# outputs: saved and re-run with one torch thread, which keeps 2 cores from being oversubscribed (137 s against 11 s for the first tutorial)
ONE_THREAD = ('tutorials/callbacks.ipynb', 'tutorials/custom_callbacks.ipynb', 'guides/coming_from_pytorch_accelerated.ipynb', 'guides/coming_from_nanogpt.ipynb')

def kernel_env(threads=None):
    "The kernel's environment, with `threads` torch (OpenMP) threads: None leaves the environment's number, 'default' torch's own"
    env = dict(KERNEL_ENV)
    if threads == 'default': env.pop('OMP_NUM_THREADS', None)
    elif threads is not None: env['OMP_NUM_THREADS'] = str(threads)
    return env

def run(nb_path, skip_slow=False, save=True, timeout=1800, kernel='python3',
        stand_in=None, # code run in place of each skipped slow cell (e.g. `DRAW`); its outputs are not kept
        threads=None): # the kernel's torch threads (`kernel_env`); the saved notebook says how many
    "Execute `nb_path` in a kernel; save it with its outputs when every cell ran. Returns (ok, seconds, slow cell times, notebook)"
    import nbformat, tempfile
    from jupyter_client import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    nb = nbformat.read(nb_path, as_version=4)
    t0, slow, i, env = time.time(), [], 0, kernel_env(threads)
    try:
        with tempfile.TemporaryDirectory() as sockets:  # the kernel talks over local sockets, not TCP
            km = KernelManager(kernel_name=kernel, transport='ipc', ip=os.path.join(sockets, 'kernel'))
            client = NotebookClient(nb, km=km, timeout=timeout, allow_errors=False, store_widget_state=False,
                                    resources={'metadata': {'path': str(nb_path.parent)}})
            try:
                with client.setup_kernel(env=env):
                    for i, cell in enumerate(nb.cells):
                        if stand_in and skip_slow and cell.cell_type == 'code' and 'slow' in directives(cell.source):
                            client.execute_cell(nbformat.v4.new_code_cell(stand_in), i)
                        if not to_run(cell, skip_slow): continue
                        t = time.time()
                        client.execute_cell(cell, i)
                        if 'slow' in directives(cell.source): slow.append((i, time.time() - t))
            finally:  # nbclient leaves a kernel it was given running: with -j and many notebooks they would pile up
                if km.has_kernel: km.shutdown_kernel(now=True)
    except CellExecutionError as e:
        msg = re.sub(r'\x1b\[[0-9;]*m', '', str(e)).strip().splitlines()
        print(f"!!! {rel(nb_path)}: cell {i} failed; not saved:\n    " + '\n    '.join(msg[-12:]))
        return False, time.time() - t0, slow, nb
    nb.metadata['aisaac'] = {'outputs_from': kernels(), 'threads': env.get('OMP_NUM_THREADS', 'default')}
    if save: write(nb, nb_path)
    return True, time.time() - t0, slow, nb

def machine_paths():
    "(pattern, replacement) for the paths of this machine that outputs print: the checkout, the installed packages, PYTHONPATH's folders, the home"
    import sysconfig
    res = [(re.escape(str(ROOT)) + '/', ''), (re.escape(sysconfig.get_paths()['purelib']) + '/', '')]  # aisaac/sft.py, torch/...
    res.append((r'/\S*?/ipykernel_\d+/\d+\.py', '<cell>'))  # a warning raised in a cell: the kernel's file for the cell
    res += [(re.escape(p.rstrip('/')) + '/', '') for p in os.environ.get('PYTHONPATH', '').split(os.pathsep)
            if os.path.isabs(p) and p.strip('/')]  # (wheels carried to a GPU)
    return res + [(re.escape(str(Path.home())) + '/', '~/')]

def coalesce(outs):
    "Consecutive outputs of one stream as one: a kernel under load may send a printed line and its newline in two messages"
    res = []
    for o in outs:
        if o['output_type'] == 'stream' and res and res[-1]['output_type'] == 'stream' and res[-1]['name'] == o['name']:
            res[-1] = type(o)({**res[-1], 'text': ''.join(res[-1]['text']) + ''.join(o['text'])})
        else: res.append(o)
    return res

# A temporary folder a cell made (`tempfile.mkdtemp()`, `TemporaryDirectory()`): its random name is neither the reader's
# nor the same from run to run, so the docs show it as `<tmp>` (scripts/docs.py's check refuses the raw name).
TEMP_DIR = re.compile(r"(?<![\w.])(?:/private)?(?:/tmp|/var/tmp|/var/folders/[\w.+-]+/[\w.+-]+/T)/(?:tmp|pytest-of-[\w.-]+/pytest-\d+/)[\w.-]*")
# A warning as Python prints it: `file:line: Category: message`, then the line of source that raised it. The docs show
# `Category: message`: the source line (`  warnings.warn(...)`) is the library's, not what the reader's code did.
WARNING = re.compile(r"^(?:\S[^\n]*?):\d+: (\w*Warning: [^\n]*)\n(?:  [^\n]*\n)?", re.M)

def clean_warnings(text):
    "Python's printed warnings in `text` without their file, line and source line"
    return WARNING.sub(lambda m: m[1] + '\n', text)

def sanitise(nb):
    "Replace the paths of this machine in `nb`'s outputs (a warning's file, a traceback) by relative ones, temporary folders by `<tmp>`, and print warnings without their source line: the docs show no developer's folders; a printed line is one output (`coalesce`)"
    subs = machine_paths() + [(TEMP_DIR.pattern, '<tmp>')]
    def clean(text, stream=False):
        lines = text if isinstance(text, list) else [text]
        for pat, rep in subs: lines = [re.sub(pat, rep, l) for l in lines]
        if stream: lines = clean_warnings(''.join(lines)).splitlines(True) if isinstance(text, list) else [clean_warnings(lines[0])]
        return lines if isinstance(text, list) else lines[0]
    for cell in nb.cells:
        if 'outputs' in cell: cell['outputs'] = coalesce(cell['outputs'])
        for o in cell.get('outputs', []):
            if 'text' in o: o['text'] = clean(o['text'], stream=o.get('name') == 'stderr')
            for k, v in o.get('data', {}).items():
                if k.startswith('text/'): o['data'][k] = clean(v)
            if 'traceback' in o: o['traceback'] = clean(o['traceback'])
    return nb

def kernels():
    """The CPU kernels this machine's PyTorch runs, e.g. 'x86_64 AVX512': float32 sums come out in another order on another kind
    (AVX2 against AVX-512), so a seeded training's last digits, and a chaotic one's later figures, differ between them"""
    import platform, torch
    return f'{platform.machine()} {torch.backends.cpu.get_cpu_capability()}'

def write(nb, path):
    """Save the executed `nb` at `path` as the docs keep it: no widget state, no machine paths, cleaned by `nbdev-clean`; the
    notebook's metadata says which CPU kernels and how many threads gave its outputs (`run`, `kernels`: tests/test_notebooks.py re-runs
    a page with its threads, and compares a re-run on another kind of CPU more loosely)"""
    import nbformat
    nb.metadata.pop('widgets', None)
    nb.metadata.setdefault('aisaac', {'outputs_from': kernels()})
    nbformat.write(sanitise(nb), path)
    subprocess.run([str(Path(sys.executable).parent/'nbdev-clean'), '--fname', str(path)], check=True, cwd=ROOT)

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('paths', nargs='*', help='notebooks or folders (default: nbs/)')
    ap.add_argument('--skip-slow', action='store_true', help='do not run cells flagged `slow` (their saved outputs stay)')
    ap.add_argument('--check', action='store_true', help='run only; save nothing')
    ap.add_argument('--timeout', type=int, default=1800, help='seconds a cell may take (default %(default)s)')
    ap.add_argument('-j', '--jobs', type=int, default=1, help='notebooks run at once, each in its own kernel (default %(default)s)')
    ap.add_argument('--threads', help="the kernels' torch threads (OMP_NUM_THREADS), a number or 'default' (default: the environment's); "
                                      "(ONE_THREAD's pages: 1, as tests/test_notebooks.py re-runs them)")
    args = ap.parse_args()
    try: import nbclient, nbformat  # noqa: F401
    except ImportError: sys.exit('!!! nbclient is missing: pip install -e ".[docs]" (or `make setup`, whose EXTRAS include docs)')
    nbs, t0 = find_notebooks(args.paths), time.time()
    from concurrent.futures import ThreadPoolExecutor
    def one(nb):
        threads = args.threads or ('1' if nb.is_relative_to(NBS) and nb.relative_to(NBS).as_posix() in ONE_THREAD else None)
        ok, secs, slow, _ = run(nb, skip_slow=args.skip_slow, save=not args.check, timeout=args.timeout, threads=threads)
        extra = ''.join(f"; slow cell {i}: {s:.0f} s" for i, s in slow)
        print(f"{'ran' if ok else 'FAILED'} {rel(nb)} in {secs:.1f} s{extra}", flush=True)
        return nb, ok
    with ThreadPoolExecutor(max(1, args.jobs)) as ex:
        failed = [nb for nb, ok in ex.map(one, nbs) if not ok]
    print(f">>> {len(nbs) - len(failed)} of {len(nbs)} notebooks ran{' and were saved' if not args.check else ''} "
          f"in {time.time() - t0:.0f} s")
    if failed: sys.exit(f"!!! failed: {', '.join(str(rel(f)) for f in failed)}")
