#!/usr/bin/env python
"""Checkpoints that do not stop training (issue 40): what a checkpoint costs the steps of the language-model recipe, written
synchronously and in the background (`CheckpointCB(background=True)`).

The recipe is `bench/lm.py`'s: the tutorial's GPT (`get_model_gpt(2048, n_layer=4, n_head=4, d_model=192, dropout=0.1)`, 2.2M
parameters; `--layers`/`--width` for a larger one) on blocks of 128 tokens, batches of 32, fused AdamW, warm-up + cosine, bf16
autocast, clipping to norm 1, trained by the tutorial's trainer. Random tokens stand in for the corpus. Each repeat trains a
fresh copy of one model for `--batches` batches three ways, in random order:

  none        no checkpoint
  sync        `CheckpointCB(every=f'{--every} steps')`: the loop waits while each checkpoint is written and sealed
  background  the same with `background=True`: the state is copied at the event, then written and sealed by a background thread

Every training iteration is timed (from one batch's start to the next's, the checkpoint event included; on a GPU after a
device sync), and sorted: the iteration whose checkpoint event saved (its `stall`: the event's own time, the whole write when
synchronous, the copy when in the background), the iterations that started while a background write was under way (`while
written`), and the others. The figures are medians; the ratios are to the median iteration of `none` in the same repeat,
then the median over repeats. The target: an iteration while a checkpoint is written in the background <= 1.1x one without
a checkpoint.

`--gil`: does a background write let the training thread run? A Python loop in the main thread is timed alone, and while
a sealed checkpoint of `--mib` MiB is written by a thread, then by another process: if the thread's slowdown is no worse than
the process's, it is the cores' contention, not the GIL.

Run: `python bench/checkpoint.py` (`--repeats 3 --batches 40 --every 5`), `--quick`, `--device`, `--layers 8 --width 512`, `--gil`.
"""
import argparse, copy, multiprocessing, random, statistics, sys, tempfile, threading, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from _common import Stop, machine
from lm import OPT, BS, T, LR, STEPS, WARMUP, sync
from aisaac.core.callback import Callback
from aisaac.utils import set_seed
from aisaac.data import DataLoaders, TensorLoader
from aisaac.models import get_model_gpt, lm_loss
from aisaac.trainer import Trainer
from aisaac.persist import CheckpointEngine
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.schedule import WarmupCosineSchedulerCB
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.callbacks.gradients import GradClipCB
from aisaac.callbacks.savers import CheckpointCB

class Iterations(Callback):
    "Each training iteration's wall time, whether a background write was under way when it started, and its checkpoint event's time if it saved"
    order = -1000
    def __init__(self, dev): self.dev, self.rows, self.t0 = dev, [], None
    def before_batch(self, t):
        sync(self.dev)
        now = time.perf_counter()
        if self.t0 is not None: self.rows.append((now - self.t0, self.busy, self.stall))
        self.t0, self.stall = now, None
        self.busy = bool(t.checkpoint_engine.queue.writes())

class EventStart(Callback):
    order = 99  # just before CheckpointCB at the checkpoint event
    def __init__(self, it): self.it = it
    def checkpoint(self, t, at): sync(self.it.dev); self.t0, self.last = time.perf_counter(), getattr(t.__dict__.get('CheckpointCB'), 'last', None)

class EventEnd(Callback):
    order = 101  # just after it
    def __init__(self, start): self.start = start
    def checkpoint(self, t, at):
        cb = t.__dict__.get('CheckpointCB')
        if cb is not None and cb.last != self.start.last:
            sync(self.start.it.dev)
            self.start.it.stall = time.perf_counter() - self.start.t0

def run(model, dls, n, dev, how, every, folder):
    "Train `model` for `n` batches with no checkpoint, synchronous ones or background ones: the iterations' rows"
    it = Iterations(dev)
    ckpt = [] if how == 'none' else [CheckpointCB(folder, every=f'{every} steps', every_n_epochs=None, keep_last=2, background=how == 'background')]
    t = Trainer(dls, lm_loss, OPT, model, callbacks=[BasicTrainCB(), MetricsCB(show=False), WarmupCosineSchedulerCB(warmup=WARMUP), GradClipCB(1.0),
                                                    MixedPrecisionCB(torch.bfloat16), Stop(n), it, s := EventStart(it), EventEnd(s), *ckpt])
    t.fit(steps=STEPS, lr=LR, valid=False)
    return it.rows[1:]  # (the first iteration warms up)

def med(xs): return statistics.median(xs) if xs else float('nan')

def recipe(a):
    dev = torch.device(a.device)
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 2048, (BS * max(a.batches, 8) * 2, T + 1), generator=g).to(dev)
    dls = DataLoaders(TensorLoader(blocks[:, :-1], blocks[:, 1:], bs=BS, shuffle=True, seed=0), TensorLoader(blocks[:BS, :-1], blocks[:BS, 1:], bs=BS))
    set_seed(1)
    base = get_model_gpt(2048, n_layer=a.layers, n_head=4, d_model=a.width, block_size=T, dropout=0.1).to(dev)
    n_par = sum(p.numel() for p in base.parameters())
    with tempfile.TemporaryDirectory() as d:
        print(f"# the language-model recipe (GPT {a.layers}x{a.width}, {n_par:,} parameters, fused AdamW, bf16, clipping), {BS} blocks of {T} tokens, "
              f"{a.repeats} repeats of {a.batches} training batches, a checkpoint every {a.every} steps, on {dev.type}; checkpoints in {d}\n# {machine()}", flush=True)
        rows = {k: [] for k in ('none', 'sync', 'background')}
        plain, ratios = [], {'sync stall': [], 'background stall': [], 'while written': [], 'background others': []}
        for r in range(a.repeats):
            res = {}
            for how in random.sample(list(rows), 3):
                set_seed(100 + r)
                res[how] = run(copy.deepcopy(base), dls, a.batches, dev, how, a.every, Path(d)/f'{how}_{r}')
                rows[how] += res[how]
            p = med([x for x, _, _ in res['none']])
            plain.append(p)
            bg = res['background']
            ratios['sync stall'].append(med([x for x, _, s in res['sync'] if s is not None]) / p)
            ratios['background stall'].append(med([x for x, _, s in bg if s is not None]) / p)
            ratios['while written'].append(med([x for x, busy, s in bg if busy and s is None]) / p)
            ratios['background others'].append(med([x for x, busy, s in bg if not busy and s is None]) / p)
            print(f"#   repeat {r+1}: no checkpoint {p*1000:.0f} ms an iteration; sync: the saving iteration {ratios['sync stall'][-1]:.2f}x; background: "
                  f"the saving iteration {ratios['background stall'][-1]:.2f}x, while written {ratios['while written'][-1]:.3f}x "
                  f"({sum(busy and s is None for _, busy, s in bg)} iterations), the others {ratios['background others'][-1]:.3f}x", flush=True)
        size = sum(f.stat().st_size for f in Path(d).glob('sync_0/*.pt')) / max(1, len(list(Path(d).glob('sync_0/*.pt')))) / 2**20
    print(f"\n# a checkpoint: {size:.1f} MiB (sealed)")
    print("| variant | iterations | iteration (median) | the checkpoint event (median) | iterations while written | ratio to no checkpoint |")
    print("|---|---|---|---|---|---|")
    for how, rs in rows.items():
        ev, busy = [s for _, _, s in rs if s is not None], [x for x, b, s in rs if b and s is None]
        cells = [how, str(len(rs)), f"{med([x for x, _, _ in rs])*1000:.0f} ms", f"{med(ev)*1000:.0f} ms" if ev else '-',
                 f"{len(busy)} ({med(busy)*1000:.0f} ms)" if busy else '-']
        ratio = '1' if how == 'none' else f"the saving iteration {med(ratios[f'{how} stall']):.2f}x"
        if how == 'background': ratio += f"; while written **{med(ratios['while written']):.3f}x**; the others {med(ratios['background others']):.3f}x"
        print('| ' + ' | '.join(cells + [ratio]) + ' |')
    w = med(ratios['while written'])
    print(f"# target: an iteration while a checkpoint is written in the background <= 1.1x one without a checkpoint: {w:.3f}x -> {'MET' if w <= 1.1 else 'NOT MET'}")

def _spin(secs):
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < secs: sum(range(2000)); n += 1
    return n / (time.perf_counter() - t0)

def _during(start, alive):
    "Python loop iterations per second in this thread while a write runs"
    t0, n = time.perf_counter(), 0
    start()
    while alive(): sum(range(2000)); n += 1
    return n / (time.perf_counter() - t0), time.perf_counter() - t0

def _write(state, path): CheckpointEngine().save(state, path)

def gil(a):
    "A Python loop's speed in the main thread while a sealed checkpoint is written by a thread, then by a process"
    torch.set_num_threads(1)
    state = {f'w{i}': torch.randn(a.mib * 2**20 // 4 // 50) for i in range(50)}
    print(f"# a Python loop in the main thread while a sealed checkpoint of {a.mib} MiB is written by a thread or by a process, "
          f"{a.repeats} repeats\n# {machine()}", flush=True)
    res = {'thread': [], 'process': []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.repeats):
            for how in random.sample(list(res), 2):
                alone = _spin(0.7)
                if how == 'thread': w = threading.Thread(target=_write, args=(state, f'{d}/t.pt'))
                else: w = multiprocessing.get_context('fork').Process(target=_write, args=(state, f'{d}/p.pt'))
                speed, secs = _during(w.start, w.is_alive)
                w.join()
                res[how].append(speed / alone)
                print(f"#   repeat {r+1}, {how}: the loop at {speed / alone:.2f}x of its speed alone, for the {secs:.2f} s of the write", flush=True)
    print(f"| writer | the main thread's Python loop, to its speed alone (median; each repeat) |\n|---|---|")
    for how, xs in res.items(): print(f"| a {how} | {med(xs):.2f}x ({', '.join(f'{x:.2f}' for x in xs)}) |")

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--batches', type=int, default=40, help='training batches per fit (default 40)')
    p.add_argument('--every', type=int, default=5, help='a checkpoint every this many steps (default 5)')
    p.add_argument('--layers', type=int, default=4)
    p.add_argument('--width', type=int, default=192)
    p.add_argument('--threads', type=int, default=0, help="torch.set_num_threads (default 0: torch's default)")
    p.add_argument('--quick', action='store_true', help='1 repeat of 12 batches, a checkpoint every 3 steps')
    p.add_argument('--gil', action='store_true', help='the GIL test instead of the recipe')
    p.add_argument('--mib', type=int, default=200, help='--gil: the checkpoint size')
    a = p.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    if a.quick: a.repeats, a.batches, a.every, a.mib = 1, 12, 3, 50
    (gil if a.gil else recipe)(a)

if __name__ == '__main__':
    main()
