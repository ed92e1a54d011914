#!/usr/bin/env python
"""Images per second that the data paths feed, on the Fashion-MNIST training split, batch 64, shuffled.

  with_transform PIL   torch DataLoader over `dsd['train']` with `with_transform` + `pil_to_tensor`
                       (what `DataLoaders.from_dataset_dict(dsd, 64)` builds), num_workers 0 and 2
  converted tensors    torch DataLoader(TensorDataset(x, y)) over the tensors `to_tensors` made, num_workers 0 and 2
  fast TensorLoader    aisaac's `TensorLoader(x, y, shuffle=True)` (what `fast=True` builds); no workers

Only the loading is timed: batches are drawn and dropped. The first batch of each pass is drawn before
the clock starts (worker start-up is not counted; it is reported separately for num_workers=2). The PIL
path is timed over a limited number of batches (it is slow); the others over a full epoch. Passes are
interleaved; each figure is the median of the repeats. The conversion to tensors (`to_tensors`) is timed
separately: its first call decodes every image, a second call returns the per-process cache.

Run: `python bench/data.py` (about 1-2 minutes), `--quick` for a smoke run.
"""
import argparse, random, statistics, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's aisaac, also without `pip install -e`

import torch
from torch.utils.data import DataLoader, TensorDataset

from _common import machine, tfm
import aisaac.data as data
from aisaac.data import TensorLoader, collate_dict, load_fashion_mnist, to_tensors

BS = 64
DEFAULT_THREADS = torch.get_num_threads()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--quick', action='store_true', help='fewer batches and repeats')
    p.add_argument('--repeats', type=int, default=None, help='passes per variant (default 3, quick 1)')
    p.add_argument('--threads', type=int, nargs='+', default=None,
                   help='torch.set_num_threads settings to time (default: torch\'s default, %d here). Give ONE value per run: '
                        'switching thread counts within a process made later multi-threaded TensorLoader passes ~100x slower' % torch.get_num_threads())
    p.add_argument('--pil-batches', type=int, default=None, help='batches timed on the PIL path (default 200, quick 40)')
    return p.parse_args()


def time_pass(make_loader, max_batches=None):
    "(images per second after the first batch, seconds to the first batch)"
    t0 = time.perf_counter()
    it = iter(make_loader())
    next(it)
    t_first = time.perf_counter() - t0
    n, t0 = 0, time.perf_counter()
    for i, b in enumerate(it):
        n += len(b[0])
        if max_batches is not None and i + 1 >= max_batches: break
    dt = time.perf_counter() - t0
    del it
    return n / dt, t_first


def main():
    args = parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    pil_batches = args.pil_batches or (40 if args.quick else 200)

    t0 = time.perf_counter()
    dsd = load_fashion_mnist().with_transform(tfm)
    t_load = time.perf_counter() - t0
    trn = dsd['train']
    t0 = time.perf_counter(); x, y = to_tensors(trn, cache=False); t_conv1 = time.perf_counter() - t0  # the conversion itself
    data._converted.clear(); to_tensors(trn)  # writes the disk cache, if it was not there
    data._converted.clear()  # as in a new run: only the disk cache left
    t0 = time.perf_counter(); to_tensors(trn); t_disk = time.perf_counter() - t0
    t0 = time.perf_counter(); to_tensors(trn); t_conv2 = time.perf_counter() - t0

    def pil(nw): return lambda: DataLoader(trn, BS, shuffle=True, collate_fn=collate_dict(trn), num_workers=nw)
    def tens(nw): return lambda: DataLoader(TensorDataset(x, y), BS, shuffle=True, num_workers=nw)
    threads = args.threads or [DEFAULT_THREADS]
    paths = {('with_transform PIL', 0): (pil(0), pil_batches), ('with_transform PIL', 2): (pil(2), pil_batches),
             ('converted tensors', 0): (tens(0), None), ('converted tensors', 2): (tens(2), None),
             ('fast TensorLoader', 0): (lambda: TensorLoader(x, y, bs=BS, shuffle=True), None)}
    variants = {(th, *k): v for th in threads for k, v in paths.items()}
    res = {k: [] for k in variants}
    random.seed(0)
    for r in range(repeats):
        order = list(variants)
        random.shuffle(order)
        for k in order:
            torch.set_num_threads(k[0])
            res[k].append(time_pass(*variants[k]))
    torch.set_num_threads(DEFAULT_THREADS)

    print(f"# data paths: Fashion-MNIST train ({len(trn)} images 1x28x28), batch {BS}, shuffled, normalized")
    print(f"# {machine(threads=str(DEFAULT_THREADS) + ' (default)')}")
    print(f"# load_fashion_mnist (disk cache present): {t_load:.2f} s")
    print(f"# to_tensors(train): conversion {t_conv1:.2f} s ({len(trn)/t_conv1:,.0f} img/s); a new run, from the disk cache "
          f"{t_disk:.3f} s; again in this process {t_conv2*1e3:.3f} ms")
    print(f"# median of {repeats} interleaved pass(es); PIL path over {pil_batches} batches, the others over a full epoch\n")
    print(f"| {'threads':>7} | {'path':<20} | {'workers':>7} | {'images/s':>12} | {'vs PIL nw=0':>11} | {'1st batch s':>11} |")
    print(f"|{'-'*9}|{'-'*22}|{'-'*9}|{'-'*14}|{'-'*13}|{'-'*13}|")
    meds = {k: statistics.median(o[0] for o in v) for k, v in res.items()}
    for (th, name, nw), v in res.items():
        base, first = meds[(th, 'with_transform PIL', 0)], statistics.median(o[1] for o in v)
        print(f"| {th:>7} | {name:<20} | {nw if name != 'fast TensorLoader' else '-':>7} | {meds[(th, name, nw)]:12,.0f} | "
              f"{meds[(th, name, nw)]/base:10.1f}x | {first:11.3f} |")
    print()
    for th in threads:
        fast, base = meds[(th, 'fast TensorLoader', 0)], meds[(th, 'with_transform PIL', 0)]
        best_pil = max(base, meds[(th, 'with_transform PIL', 2)])
        print(f"# target (torch threads {th}): fast path >= 25x the with_transform PIL path: {fast/base:.1f}x vs num_workers=0, "
              f"{fast/best_pil:.1f}x vs the faster PIL setting -> {'MET' if fast/best_pil >= 25 else 'MISSED'}")


if __name__ == '__main__':
    main()
