#!/usr/bin/env python
"""Run a notebook on the GPU machine and save it with its outputs, for the docs: `python bench/gpu_nb.py NB OUT`.

bench/gpu_page.ipynb is the GPU page (issue 41: the vision and LM recipes eager and graphed, from one seed). It lives here, out
of nbs/, until a run on a lent GPU saves its outputs: then `nbdev-clean --fname OUT` and move OUT to nbs/tutorials/gpu.ipynb
(its cells flagged `cuda` are skipped by nbdev-test and by scripts/run_nbs.py where there is no GPU; its outputs stay).
tests/test_graphs.py runs it on the CPU with `--skip cuda`, so that its code keeps working until then.

The `device` tool's GPU image has no Jupyter, so this runs the notebook in-process with execnb (nbdev's own runner, carried as
wheels by bench/gpu_prep.sh), every cell included (the `cuda` ones too), stopping at the first error. The outputs are cleaned
as scripts/run_nbs.py cleans them (the machine's paths, PYTHONPATH's among them: gpu_run.sh's /tmp/site). `--skip FLAG` leaves out the cells flagged FLAG (a check on a CPU: `--skip cuda`).
"""
import argparse, importlib.util, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location('run_nbs', ROOT/'scripts'/'run_nbs.py')
run_nbs = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(run_nbs)

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('nb'); ap.add_argument('out'); ap.add_argument('--skip', action='append', default=[])
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from fastcore.nbio import read_nb, write_nb
    from execnb.shell import CaptureShell
    nb, t0 = read_nb(args.nb), time.time()
    skip = lambda c: not run_nbs.to_run(c, skip_slow=False) or any(f in run_nbs.directives(c.source) for f in args.skip)
    def timed(c): print(f"# cell {c.get('idx_', '?')} ran at +{time.time() - t0:.0f} s", flush=True)
    shell = CaptureShell(path=Path(args.nb).parent.resolve(), mpl_format='png')
    shell.run_all(nb, exc_stop=True, preproc=skip, postproc=timed)
    write_nb(run_nbs.sanitise(nb), args.out)
    print(f"saved {args.out} in {time.time() - t0:.0f} s")
