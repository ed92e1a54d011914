#!/usr/bin/env python
"""Seconds per epoch on the real workload: Fashion-MNIST, `get_model_conv`, Adam lr 1e-3, batch 64.

Three variants, each trained from the same seed and initial weights, with the epochs interleaved
(variant A epoch 1, B epoch 1, C epoch 1, A epoch 2, ...: each variant keeps one Adam optimizer over
its epochs, so `fit(1)` repeated equals one `fit(n)`). An epoch is one training pass and one validation
pass over the 10k test images; s/epoch is the median over the epochs.

  raw loop          hand-written loop (zero_grad, forward, loss, backward, step; then an eval pass)
                    over torch DataLoader(TensorDataset(x, y), 64, shuffle=True) of the converted tensors
  aisaac default    DataLoaders.from_dataset_dict(dsd, 64): with_transform + pil_to_tensor per batch,
                    torch DataLoader, CoreCBs(progress=False, activation_stats=False, Accuracy=MulticlassAccuracy())
  aisaac fast       the same with fast=True (tensors converted once, served by TensorLoader)

Data conversion (`to_tensors`, done once, then cached in the process and on disk) is timed separately, not in the epochs.

Run: `python bench/fmnist.py` (about 2-3 minutes on 2 cores), `--epochs N`, `--quick` for a smoke run
(1 epoch on 6000/1000 sampled images).
"""
import argparse, copy, statistics, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's aisaac, also without `pip install -e`

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torcheval.metrics import MulticlassAccuracy

from _common import machine, tfm
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.groups import CoreCBs
import aisaac.data as data
from aisaac.data import DataLoaders, load_fashion_mnist, sample_dataset_dict, to_tensors
from aisaac.models import get_model_conv
from aisaac.utils import set_seed

BS, LR, SEED = 64, 1e-3, 42


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--epochs', type=int, default=3, help='epochs per variant (default 3)')
    p.add_argument('--quick', action='store_true', help='1 epoch on a 6000/1000-image sample')
    p.add_argument('--threads', type=int, default=1, help='torch.set_num_threads (default 1: steadier on a shared machine; 0 = torch\'s default)')
    return p.parse_args()


class RawLoop:
    "The hand-written baseline: one Adam over all epochs, an eval pass computing loss and accuracy"
    def __init__(self, model, train_dl, valid_dl):
        self.model, self.train_dl, self.valid_dl = model, train_dl, valid_dl
        self.opt, self.loss_func, self.acc = torch.optim.Adam(model.parameters(), lr=LR), nn.CrossEntropyLoss(), None
    def epoch(self):
        model, opt, loss_func = self.model, self.opt, self.loss_func
        model.train()
        for xb, yb in self.train_dl:
            opt.zero_grad()
            loss = loss_func(model(xb), yb)
            loss.backward()
            opt.step()
        model.eval()
        correct = n = 0
        with torch.no_grad():
            for xb, yb in self.valid_dl:
                correct += (model(xb).argmax(1) == yb).sum().item()
                n += len(yb)
        self.acc = correct / n


class AisaacRun:
    "A Trainer with CoreCBs(progress=False) whose optimizer persists across `fit(1)` calls"
    def __init__(self, model, dls):
        self.opt = torch.optim.Adam(model.parameters(), lr=LR)
        self.trainer = Trainer(dls, nn.CrossEntropyLoss(), lambda params, lr: self.opt, model=model,
                               callbacks=[CoreCBs(device='cpu', progress=False, activation_stats=False, Accuracy=MulticlassAccuracy())])
        self.acc = None
    def epoch(self):
        self.trainer.fit(1, lr=LR)
        self.acc = self.trainer.MetricsCB.metrics_epoch[-1]['Accuracy']


def warm_up(model, trn, n=30):
    "Train a throwaway copy for `n` batches and evaluate a few, so that no variant pays torch's first-call costs"
    opt, loss_func = torch.optim.Adam(model.parameters(), lr=LR), nn.CrossEntropyLoss()
    for i in range(n):
        xb, yb = trn[0][i*BS:(i+1)*BS], trn[1][i*BS:(i+1)*BS]
        loss_func(model(xb), yb).backward()
        opt.step(); opt.zero_grad()
    with torch.no_grad():
        for i in range(5): model(trn[0][i*BS:(i+1)*BS])


def main():
    args = parse_args()
    if args.threads: torch.set_num_threads(args.threads)
    epochs = 1 if args.quick else args.epochs

    t0 = time.perf_counter()
    raw_dsd = load_fashion_mnist()
    t_load = time.perf_counter() - t0
    if args.quick: raw_dsd = sample_dataset_dict(raw_dsd, 6000, 1000)
    dsd = raw_dsd.with_transform(tfm)

    t0 = time.perf_counter()
    trn, val = to_tensors(dsd['train'], cache=False), to_tensors(dsd['test'], cache=False)
    t_conv = time.perf_counter() - t0
    for split in ('train', 'test'): data._converted.clear(); to_tensors(dsd[split])  # fill the disk cache, if needed
    data._converted.clear()
    t0 = time.perf_counter()
    to_tensors(dsd['train']), to_tensors(dsd['test'])
    t_disk = time.perf_counter() - t0

    set_seed(SEED)
    base = get_model_conv()
    raw_dls = (DataLoader(TensorDataset(*trn), BS, shuffle=True), DataLoader(TensorDataset(*val), BS))
    runs = {'raw loop': RawLoop(copy.deepcopy(base), *raw_dls),
            'aisaac default': AisaacRun(copy.deepcopy(base), DataLoaders.from_dataset_dict(dsd, BS)),
            'aisaac fast': AisaacRun(copy.deepcopy(base), DataLoaders.from_dataset_dict(dsd, BS, fast=True))}
    n_train, n_valid = len(trn[0]), len(val[0])
    warm_up(copy.deepcopy(base), trn)

    print(f"# Fashion-MNIST, get_model_conv, Adam lr {LR}, batch {BS}, {epochs} epoch(s) of {n_train} train + {n_valid} valid images")
    print(f"# {machine()}")
    print(f"# load_fashion_mnist {t_load:.2f} s; to_tensors train+test: conversion {t_conv:.2f} s, from the disk cache (a new run) {t_disk:.2f} s "
          f"(not counted in the epochs)")
    times = {k: [] for k in runs}
    for ep in range(epochs):
        for k, run in runs.items():
            set_seed(SEED + ep)  # same shuffling seed for every variant at each epoch
            t0 = time.perf_counter()
            run.epoch()
            times[k].append(time.perf_counter() - t0)
            print(f"#   epoch {ep+1} {k:<15} {times[k][-1]:7.2f} s  valid accuracy {run.acc:.4f}", flush=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n| {'variant':<15} | {'s/epoch':>8} | {'ratio':>6} | {'train img/s':>11} | {'valid acc':>9} | {'acc - raw':>9} |")
    print(f"|{'-'*17}|{'-'*10}|{'-'*8}|{'-'*13}|{'-'*11}|{'-'*11}|")
    raw_acc = runs['raw loop'].acc
    for k, run in runs.items():
        print(f"| {k:<15} | {med[k]:8.2f} | {med[k]/med['raw loop']:6.3f} | {n_train/med[k]:11.0f} | {run.acc:9.4f} | "
              f"{(run.acc-raw_acc)*100:+8.2f}p |")
    fast_ratio, dacc = med['aisaac fast'] / med['raw loop'], (runs['aisaac fast'].acc - raw_acc) * 100
    print(f"\n# target: aisaac fast <= 0.95x raw loop at the same accuracy (within 0.5 points): "
          f"{fast_ratio:.3f}x, {dacc:+.2f} points -> {'MET' if fast_ratio <= 0.95 and abs(dacc) <= 0.5 else 'MISSED'}")
    print(f"# (train img/s counts the training images only, but the epoch time includes the validation pass)")


if __name__ == '__main__':
    main()
