#!/usr/bin/env python
"""Seconds per training batch of the vision tutorial's recipe: aisaac against a hand-written loop doing the same work.

The recipe of `nbs/tutorials/vision.ipynb`, step 5: `get_model_resnet()` in channels-last memory, AdamW, a one-cycle
schedule stepped every batch, bfloat16 autocast for the forward pass and the loss, and a random crop (padding 1,
edge pixels repeated) plus a random flip on each training batch, batches of 256 from the tensor fast path.

  raw loop   the same steps written out: augment, autocast forward and loss, backward, step, zero_grad, scheduler step
  aisaac     Trainer with DeviceCB, BasicTrainCB, MetricsCB(Accuracy), OneCycleSchedulerCB, MixedPrecisionCB and
             BatchAugmentationCB: the tutorial's callbacks without the progress bar

Both read the same `TensorLoader`. Each repeat trains a fresh copy of one initial model for `--batches` batches (a
training-only fit cancelled after that many), the two variants in random order; the figure is the median over
repeats of the seconds per batch, and the ratio the median of the per-repeat ratios. This measures what the loop
costs on a workload where the model dominates (about 0.1 s a batch on 2 CPU cores), unlike `overhead.py`'s tiny MLP.

Run: `python bench/vision.py` (about a minute and a half on 2 cores), `--repeats`, `--batches`, `--quick`.
"""
import copy, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's aisaac, also without `pip install -e`

import torch
from torch import nn
from torcheval.metrics import MulticlassAccuracy

from _common import Stop, bench_args, interleaved, machine, tfm
from aisaac.core.callback import Callback, CancelFitException
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, load_fashion_mnist, sample_dataset_dict
from aisaac.models import get_model_resnet
from aisaac.utils import set_seed
from aisaac.callbacks.train import BasicTrainCB, DeviceCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.schedule import OneCycleSchedulerCB
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.callbacks.augment import BatchAugmentationCB, RandomCrop, RandomHorizontalFlip

BS, LR, EPOCHS = 256, 1e-2, 10  # the schedule is laid out for the tutorial's 10 epochs; a run trains only its first batches

def augment(): return nn.Sequential(RandomCrop(28, padding=1, mode='replicate'), RandomHorizontalFlip())

def raw(model, dl, n):
    "The hand-written loop: `n` training batches of the recipe; seconds per batch"
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=EPOCHS * len(dl))
    aug, loss_func = augment(), nn.CrossEntropyLoss()
    model.train()
    t0, i = time.perf_counter(), 0
    while True:
        for xb, yb in dl:
            xb = aug(xb)
            with torch.autocast('cpu', dtype=torch.bfloat16):
                loss = loss_func(model(xb).float(), yb)
            loss.float().backward()
            opt.step(); opt.zero_grad(); sched.step()
            i += 1
            if i == n: return (time.perf_counter() - t0) / n

def aisaac(model, dls, n):
    "The tutorial's trainer: `n` training batches; seconds per batch"
    trainer = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.AdamW, model,
                      callbacks=[DeviceCB('cpu'), BasicTrainCB(), MetricsCB(Accuracy=MulticlassAccuracy(), show=False),
                                 OneCycleSchedulerCB(), MixedPrecisionCB(), BatchAugmentationCB(augment(), on_valid=False), Stop(n)])
    t0 = time.perf_counter()
    trainer.fit(EPOCHS, lr=LR, valid=False)
    return (time.perf_counter() - t0) / n

def main():
    reps, n, quick = bench_args(__doc__, '2 repeats of 8 batches on a 4,000-image sample')
    dsd = load_fashion_mnist()
    if quick: dsd = sample_dataset_dict(dsd, 4000, 500)
    dls = DataLoaders.from_dataset_dict(dsd.with_transform(tfm), BS, fast=True)
    set_seed(1)
    base = get_model_resnet().to(memory_format=torch.channels_last)
    raw(copy.deepcopy(base), dls.train, 10)  # warm-up: torch's first-call costs, oneDNN's kernel choices
    print(f"# the vision tutorial's recipe (ResNet, AdamW, one cycle, bf16, channels-last, crop + flip), batch {BS}, "
          f"{reps} repeats of {n} training batches")
    print(f"# {machine()}")
    interleaved(lambda m: raw(m, dls.train, n), lambda m: aisaac(m, dls, n), base, reps)

if __name__ == '__main__':
    main()
