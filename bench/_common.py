"Helpers shared by the benchmark scripts (not a benchmark itself)"
import argparse, copy, os, platform, random, statistics
import torch
from aisaac.data import pil_to_tensor
from aisaac.utils import inplace, set_seed
from aisaac.core.callback import Callback, CancelFitException

XMEAN, XSTD = 0.28, 0.35  # Fashion-MNIST pixel mean and standard deviation, as in the tutorial

@inplace
def tfm(b):
    "The tutorial's `with_transform`: images as normalised tensors"
    b['image'] = [(pil_to_tensor(o) - XMEAN) / XSTD for o in b['image']]

def machine(threads=None):
    "CPU model, core count, Python and torch versions, and torch's thread count (`threads`, else the current one)"
    cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), platform.processor())
    return (f"{cpu}, nproc {os.cpu_count()}, python {platform.python_version()}, torch {torch.__version__}, "
            f"torch threads {torch.get_num_threads() if threads is None else threads}")

def interleaved(raw, aisaac, base, reps, per_batch=None):
    """Run `raw(model)` and `aisaac(model)` (each returns seconds per batch) on fresh copies of `base`, `reps` times, in random order
    within each repeat and seeded alike; print each repeat and a table (with tokens/s when `per_batch` tokens are given)"""
    times, ratios = {'raw loop': [], 'aisaac': []}, []
    for r in range(reps):
        res = {}
        for name in random.sample(list(times), 2):
            set_seed(100 + r)  # the same augmentations and shuffling for both variants of a repeat
            res[name] = (raw if name == 'raw loop' else aisaac)(copy.deepcopy(base))
            times[name].append(res[name])
        ratios.append(res['aisaac'] / res['raw loop'])
        print(f"#   repeat {r+1}: raw {res['raw loop']*1000:.1f} ms, aisaac {res['aisaac']*1000:.1f} ms per batch, ratio {ratios[-1]:.3f}", flush=True)
    tok = per_batch is not None
    print(f"\n| variant  |{' tokens/s |' if tok else ''} ms/batch | ratio | spread |\n|----------|{'----------|' if tok else ''}----------|-------|--------|")
    for name, ts in times.items():
        med = statistics.median(ts)
        ratio = 1.0 if name == 'raw loop' else statistics.median(ratios)
        print(f"| {name:<8} |{f' {per_batch / med:8.0f} |' if tok else ''} {med*1000:8.1f} | {ratio:5.3f} | {(max(ts) - min(ts)) / med:6.1%} |")
    return times, ratios

def bench_args(doc, quick_help, device=False):
    "The command line shared by the recipe benchmarks: (repeats, batches per repeat, whether --quick), and the device when `device`"
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if device: p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu', help="'cuda' (default where there is a GPU) or 'cpu'")
    p.add_argument('--repeats', type=int, default=5, help='repeats of each variant (default 5)')
    p.add_argument('--batches', type=int, default=40, help='training batches per repeat (default 40)')
    p.add_argument('--quick', action='store_true', help=quick_help)
    p.add_argument('--threads', type=int, default=0, help="torch.set_num_threads (default 0: torch's default, as the tutorials run)")
    args = p.parse_args()
    if args.threads: torch.set_num_threads(args.threads)
    res = (2, 8, True) if args.quick else (args.repeats, args.batches, False)
    return (*res, torch.device(args.device)) if device else res

class Stop(Callback):
    "Cancel the fit after `n` training batches"
    order = 100
    def __init__(self, n): self.n, self.i = n, 0
    def after_batch(self, trainer):
        self.i += 1
        if self.i == self.n: raise CancelFitException()
