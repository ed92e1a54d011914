"""AccelerateCB: the same Fashion-MNIST fit (tests/accel_run.py: the course's conv net with a batch norm, Adam, batch 32 per
process) on 1 and on 2 CPU processes launched by torchrun (gloo). Prints the fit time (the slowest process's) and the wall
time of the whole launch (start-up and data loading included), medians over the repeats, run interleaved.

    .venv/bin/python bench/accel.py [--n-train 16384] [--n-valid 1000] [--epochs 2] [--repeats 3] [--two-threads]
"""
import argparse, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path
import torch
from _common import machine

RUN = Path(__file__).parent.parent/'tests'/'accel_run.py'
VARIANTS = (('1 process, 1 thread', 1, 1), ('2 processes, 1 thread each', 2, 1))
TWO_THREADS = ('1 process, 2 threads', 1, 2)  # --two-threads: on a busy 2-core machine torch's 2 threads can be erratic

def launch(n_procs, threads, args):
    "Wall time of one launch and the slowest process's fit time"
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', str(n_procs),
               str(RUN), out, str(args.n_train), str(args.n_valid), str(args.epochs)]
        start = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': str(threads)})
        wall = time.perf_counter() - start
        if p.returncode: sys.exit(p.stderr[-4000:])
        results = [torch.load(Path(out)/f'result_{r}.pt', weights_only=True) for r in range(n_procs)]
        acc = results[0]['history']['epoch']['acc']['values'][-1]
        return wall, max(r['fit_time'] for r in results), acc

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--n-train', type=int, default=16384)
    ap.add_argument('--n-valid', type=int, default=1000)
    ap.add_argument('--epochs', type=int, default=2)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--two-threads', action='store_true', help='also 1 process with 2 torch threads')
    args = ap.parse_args()
    if args.two_threads: VARIANTS += (TWO_THREADS,)
    print(machine(), f'| sample: {args.n_train} train, {args.n_valid} valid images, {args.epochs} epochs')
    times = {name: [] for name, *_ in VARIANTS}
    for _ in range(args.repeats):
        for name, n, threads in VARIANTS: times[name].append(launch(n, threads, args))
    base = statistics.median(f for _, f, _ in times[VARIANTS[0][0]])
    print(f"{'variant':<28} {'fit s':>7} {'launch s':>9} {'fit vs 1 process, 1 thread':>27} {'accuracy':>9}")
    for name, rs in times.items():
        fit, wall = statistics.median(f for _, f, _ in rs), statistics.median(w for w, _, _ in rs)
        print(f"{name:<28} {fit:>7.2f} {wall:>9.2f} {base / fit:>26.2f}x {rs[-1][2]:>9.3f}")
