#!/usr/bin/env python
"""What importing aisaac costs beyond torch's own import (issue 47): `import torch`, `import aisaac.all`,
`from aisaac.all import *` and `from aisaac.trainer import Trainer` (what a test's fresh Python imports), each in a
fresh Python, in a random order within each repeat, so that a machine's load weighs on all of them alike.

Each figure is the import alone (timed inside the process, the interpreter's start left out); the table gives the
medians, and each variant's difference with `import torch` in the same repeat (the median of those). The target:
`import aisaac.all` at most torch's import + 1 s. The last line lists the modules that only some users need
(matplotlib, `datasets`, `torch.distributed.checkpoint`, transformers, tensorboard...) that the import brought in:
none, as they are imported at their first use (`aisaac.utils.LazyModule`, `LazyObject`).

    python bench/imports.py            # 7 repeats
    python bench/imports.py --quick    # 3 repeats
    python bench/imports.py --against /tmp/old-checkout   # also another checkout's aisaac, interleaved (before/after)
"""
import argparse, json, os, random, statistics, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAZY = ['matplotlib', 'datasets', 'pandas', 'pyarrow', 'torch.distributed.checkpoint', 'torch.distributed.tensor', 'transformers',
        'tensorboard', 'mlflow', 'wandb', 'accelerate', 'onnx', 'tokenizers', 'peft', 'torchdata', 'IPython']
VARIANTS = {'import torch': 'import torch', 'import aisaac.all': 'import aisaac.all',
            'from aisaac.all import *': 'from aisaac.all import *', 'from aisaac.trainer import Trainer': 'from aisaac.trainer import Trainer'}

def timed(code, root=ROOT):
    "Seconds that `code` takes in a fresh Python with the aisaac of `root`, and the modules of `LAZY` it imported"
    prog = (f"import time, sys, json; t = time.perf_counter()\n{code}\nt = time.perf_counter() - t\n"
            f"print(json.dumps([t, [m for m in {LAZY!r} if m in sys.modules]]))")
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(root), *filter(None, [os.environ.get('PYTHONPATH')])])}
    out = subprocess.run([sys.executable, '-c', prog], capture_output=True, text=True, env=env, cwd=root, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--repeats', type=int, default=7)
    p.add_argument('--quick', action='store_true', help='3 repeats')
    p.add_argument('--against', type=Path, help="another checkout (an older commit, say): its `import aisaac.all` and star import too")
    a = p.parse_args()
    reps = 3 if a.quick else a.repeats
    roots = {name: ROOT for name in VARIANTS}
    if a.against:
        for name in ('import aisaac.all', 'from aisaac.all import *'):
            VARIANTS[f'{name} ({a.against.name})'] = VARIANTS[name]; roots[f'{name} ({a.against.name})'] = a.against
    times, diffs, brought = {k: [] for k in VARIANTS}, {k: [] for k in VARIANTS}, {}
    for r in range(reps):
        res = {}
        for name in random.sample(list(VARIANTS), len(VARIANTS)):
            res[name], brought[name] = timed(VARIANTS[name], roots[name])
            times[name].append(res[name])
        for name in VARIANTS: diffs[name].append(res[name] - res['import torch'])
        print(f"#   repeat {r + 1}: " + ', '.join(f"{k} {v:.2f} s" for k, v in res.items()), flush=True)
    load = os.getloadavg()[0]
    print(f"\n# bench/imports.py: {reps} repeats, load average {load:.1f} at the end, python {sys.version.split()[0]}")
    print("| import | seconds (median) | beyond `import torch` (median of the differences) | ratio to torch |\n|---|---|---|---|")
    torch_med = statistics.median(times['import torch'])
    for name in VARIANTS:
        med = statistics.median(times[name])
        print(f"| `{name}` | {med:.2f} | {statistics.median(diffs[name]):+.2f} | {med / torch_med:.2f} |")
    extra = statistics.median(diffs['import aisaac.all'])
    print(f"# target: `import aisaac.all` at most torch's import + 1 s: {'met' if extra <= 1 else 'NOT met'} ({extra:+.2f} s)")
    print(f"# modules that only some users need, brought in by `from aisaac.all import *`: {brought['from aisaac.all import *'] or 'none'}")
    return times

if __name__ == '__main__':
    main()
