#!/usr/bin/env python
"""Run a notebook on the GPU machine and save it with its outputs, for the docs: `python bench/gpu_nb.py NB OUT`.

bench/gpu_page.ipynb is the GPU page (issue 41: the vision and LM recipes eager and graphed, from one seed). It lives here, out
of nbs/, until a run on a lent GPU saves its outputs: then `nbdev-clean --fname OUT` and move OUT to nbs/tutorials/gpu.ipynb
(its cells flagged `cuda` are skipped by nbdev-test and by scripts/run_nbs.py where there is no GPU; its outputs stay).
tests/test_graphs.py runs it on the CPU with `--skip cuda`, so that its code keeps working until then.

The `device` tool's GPU image has no Jupyter, so this runs the notebook in-process with execnb (nbdev's own runner, carried as
wheels by bench/gpu_prep.sh), every cell included (the `cuda` ones too). A run on a lent GPU must not lose what it measured
(issue 48), so a failing cell does not stop the others (its error is its output, and the exit status says that cells failed); each
cell has a time limit (`--cell-timeout`); OUT is written after every cell and once more at the end, in a `finally`, also when the
run is stopped (`timeout` sends SIGTERM, or SIGINT: the cell running then is marked as stopped, and the rest are left out). The outputs are cleaned as scripts/run_nbs.py cleans them (the machine's paths, PYTHONPATH's among them: gpu_run.sh's
/tmp/site). `--skip FLAG` leaves out the cells flagged FLAG (a check on a CPU: `--skip cuda`; `--skip hide` too: the dry run).
Exit status: 0 when every cell that ran passed, 1 when one failed, 2 when the run was stopped.
"""
import argparse, copy, importlib.util, signal, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location('run_nbs', ROOT/'scripts'/'run_nbs.py')
run_nbs = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(run_nbs)

class Stopped(KeyboardInterrupt): "The run was told to stop (SIGTERM or SIGINT)"

def errors(cell):
    "The first line of each error output of `cell`"
    return [f"{o.get('ename', '')}: {o.get('evalue', '')}".strip() for o in cell.get('outputs', []) if o.get('output_type') == 'error']

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('nb'); ap.add_argument('out'); ap.add_argument('--skip', action='append', default=[])
    ap.add_argument('--cell-timeout', type=int, default=None, help='seconds a cell may run before it is stopped (its error: a timeout)')
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from fastcore.nbio import read_nb, write_nb
    from execnb.shell import CaptureShell
    nb, t0, state = read_nb(args.nb), time.time(), {'stopped': None, 'ran': 0, 'failed': []}
    def stop(sig, frame):
        state['stopped'] = signal.Signals(sig).name
        raise Stopped(f"stopped by {state['stopped']}")
    for sig in (signal.SIGTERM, signal.SIGINT): signal.signal(sig, stop)
    def skip(c):
        if state['stopped'] or not run_nbs.to_run(c, skip_slow=False) or any(f in run_nbs.directives(c.source) for f in args.skip): return True
        state['current'] = c  # (the cell a stop interrupts)
        return False
    def save(): write_nb(run_nbs.sanitise(copy.deepcopy(nb)), args.out)
    def done(c):
        state['ran'] += 1
        if errs := errors(c): state['failed'].append((c.get('idx_', '?'), errs[0]))
        print(f"# cell {c.get('idx_', '?')} ran at +{time.time() - t0:.0f} s" + (f": FAILED, {errs[0][:200]}" if errs else ''), flush=True)
        save()  # (after every cell: a run killed outright keeps the cells before)
    shell = CaptureShell(path=Path(args.nb).parent.resolve(), mpl_format='png')
    try: shell.run_all(nb, exc_stop=False, preproc=skip, postproc=done, cell_timeout=args.cell_timeout)
    except Stopped:  # (raised where the run waits for its cell: that cell is marked, its outputs so far lost)
        if (c := state.get('current')) is not None and not errors(c):
            c.outputs = [*c.get('outputs', []), {'output_type': 'error', 'ename': 'Stopped', 'evalue': f"the run was stopped by {state['stopped']} at +{time.time() - t0:.0f} s", 'traceback': []}]
            state['ran'] += 1; state['failed'].append((c.get('idx_', '?'), f"Stopped: by {state['stopped']}"))
    finally:
        save()
        print(f"saved {args.out} in {time.time() - t0:.0f} s: {state['ran']} cells ran, {len(state['failed'])} failed"
              + ''.join(f"\n  cell {i}: {e[:300]}" for i, e in state['failed']) + (f"; the run was {state['stopped']}" if state['stopped'] else ''), file=sys.__stdout__, flush=True)  # (a cell's capture may hold sys.stdout)
    return 2 if state['stopped'] else 1 if state['failed'] else 0

if __name__ == '__main__':
    sys.exit(main())
