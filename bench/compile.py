#!/usr/bin/env python
"""Seconds per training epoch with and without `torch.compile` on the CPU: the tutorials' conv net (`get_model_conv`)
on Fashion-MNIST tensors, Adam lr 1e-3, batch 64, training passes only.

Variants (one model each, same initial weights, one optimizer kept over the epochs; epochs interleaved: A, B, C, D, A, ...):
  raw eager         hand-written loop (zero_grad, forward, loss, backward, step) over aisaac's TensorLoader
  raw compiled      the same loop with `torch.compile(model)` (inductor)
  aisaac            Trainer with DeviceCB('cpu') and BasicTrainCB, `fit(1, valid=False)`, same loader
  aisaac CompileCB  the same with `CompileCB()` (inductor)
The first epoch of each variant is a warm-up and is reported apart: for the compiled variants it includes the
compilation (the first batch, and the smaller last batch, which compiles again with dynamic shapes). Its time depends
on TorchInductor's on-disk cache (/tmp/torchinductor_$USER): a first run on a machine compiles from scratch; and the
second compiled variant (`aisaac CompileCB`) reuses the graphs `raw compiled` compiled in the same process, so its warm-up
shows the cost of a compilation already done.
s/epoch is the median of the timed epochs, in this process's CPU time by default (`--clock wall` for elapsed time: on a
shared machine it counts the other jobs too); the warm-up is elapsed time, since inductor compiles in worker processes.
ratio is against `raw eager`, the median of per-round ratios.

Run: `python bench/compile.py` (about 2-4 minutes on 2 cores), `--quick` (2000 images, 1 timed epoch).
"""
import argparse, copy, statistics, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's aisaac, also without `pip install -e`

import torch
from torch import nn

from _common import machine, tfm
from aisaac.trainer import Trainer
from aisaac.data import TensorLoader, load_fashion_mnist, sample_dataset_dict, to_tensors
from aisaac.models import get_model_conv
from aisaac.callbacks.train import BasicTrainCB, DeviceCB
from aisaac.callbacks.compilation import CompileCB

BS, LR = 64, 1e-3


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--n', type=int, default=10_000, help='training images (default 10000)')
    p.add_argument('--epochs', type=int, default=5, help='timed epochs per variant after the warm-up (default 5)')
    p.add_argument('--clock', choices=['cpu', 'wall'], default='cpu', help="'cpu': this process's CPU time (default), 'wall': elapsed time")
    p.add_argument('--quick', action='store_true', help='2000 images, 1 timed epoch')
    p.add_argument('--threads', type=int, default=1, help="torch.set_num_threads (default 1; 0 = torch's default)")
    return p.parse_args()


class Raw:
    "The hand-written loop; `compiled` trains `torch.compile(model)`"
    def __init__(self, model, loader, compiled=False):
        self.model, self.loader = (torch.compile(model) if compiled else model), loader
        self.opt, self.loss_func = torch.optim.Adam(model.parameters(), lr=LR), nn.CrossEntropyLoss()
    def epoch(self):
        model, opt, loss_func = self.model, self.opt, self.loss_func
        model.train()
        for xb, yb in self.loader:
            opt.zero_grad()
            loss = loss_func(model(xb), yb)
            loss.backward()
            opt.step()


class Aisaac:
    "A Trainer whose optimizer persists across `fit(1)` calls, with `CompileCB()` if `compiled`"
    def __init__(self, model, loader, compiled=False):
        opt = torch.optim.Adam(model.parameters(), lr=LR)
        cbs = [DeviceCB('cpu'), BasicTrainCB()] + ([CompileCB()] if compiled else [])
        self.trainer = Trainer(type('DLs', (), {'train': loader, 'valid': loader})(), nn.CrossEntropyLoss(),
                               lambda params, lr: opt, model=model, callbacks=cbs)
    def epoch(self): self.trainer.fit(1, lr=LR, valid=False)


def main():
    args = parse_args()
    if args.threads: torch.set_num_threads(args.threads)
    n, epochs = (2000, 1) if args.quick else (args.n, args.epochs)
    x, y = to_tensors(sample_dataset_dict(load_fashion_mnist(), n, 10).with_transform(tfm)['train'])
    torch.manual_seed(0)
    base = get_model_conv()
    runs = {'raw eager': Raw(copy.deepcopy(base), TensorLoader(x, y, bs=BS, shuffle=True)),
            'raw compiled': Raw(copy.deepcopy(base), TensorLoader(x, y, bs=BS, shuffle=True), compiled=True),
            'aisaac': Aisaac(copy.deepcopy(base), TensorLoader(x, y, bs=BS, shuffle=True)),
            'aisaac CompileCB': Aisaac(copy.deepcopy(base), TensorLoader(x, y, bs=BS, shuffle=True), compiled=True)}
    times, clock = {k: [] for k in runs}, time.process_time if args.clock == 'cpu' else time.perf_counter
    for r in range(1 + epochs):
        for k, run in runs.items():
            t0, c0 = time.perf_counter(), clock()
            run.epoch()
            times[k].append(time.perf_counter() - t0 if r == 0 else clock() - c0)
            print(f"# epoch {r}{' (warm-up)' if r == 0 else ''} {k}: {times[k][-1]:.2f} s", file=sys.stderr)
    print(f"# torch.compile on the CPU: get_model_conv, {n} Fashion-MNIST images, batch {BS}, Adam, training epochs")
    print(f"# {machine()}")
    print(f"# {args.clock} time; median of {epochs} timed epoch(s) after 1 warm-up epoch (elapsed); ratio = per-round time / raw eager's, median\n")
    hdr = f"| {'variant':<17} | {'warm-up s':>9} | {'s/epoch':>8} | {'ms/batch':>8} | {'ratio':>6} |"
    print(hdr); print('|' + '|'.join('-' * len(c) for c in hdr.split('|')[1:-1]) + '|')
    n_batches = -(-n // BS)
    for k, ts in times.items():
        med = statistics.median(ts[1:])
        ratio = statistics.median(a / b for a, b in zip(ts[1:], times['raw eager'][1:]))
        print(f"| {k:<17} | {ts[0]:9.2f} | {med:8.3f} | {med / n_batches * 1e3:8.2f} | {ratio:6.3f} |")


if __name__ == '__main__':
    main()
