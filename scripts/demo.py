#!/usr/bin/env python
"""aisaac demo: train the tutorial's conv net on the full Fashion-MNIST and plot its losses.

Runs the example of the README (3 epochs, batch size 64, Adam), prints the per-epoch
table (epoch, train loss, valid loss, Accuracy), then saves a loss curve to a PNG.
"""
import argparse, os, time
from pathlib import Path

os.environ.setdefault('MPLBACKEND', 'Agg')  # no display needed; set before anything imports pyplot


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('out', nargs='?', default='out/loss.png', help='where to save the loss-curve PNG (default: %(default)s)')
    p.add_argument('--fast', action='store_true',
                   help='convert each split to tensors once (DataLoaders.from_dataset_dict(..., fast=True))')
    return p.parse_args()


def smooth(xs, beta=0.98):
    "Exponential moving average with bias correction, as fastai's recorder plots it."
    avg, out = 0., []
    for i, x in enumerate(xs, 1):
        avg = beta*avg + (1-beta)*x
        out.append(avg / (1-beta**i))
    return out


def plot_losses(metrics_cb, path):
    "Save train batch losses (raw and smoothed) and per-epoch valid losses to `path`."
    import matplotlib.pyplot as plt
    train = [float(o['loss']) for o in metrics_cb.losses_batch if o['training']]
    epochs = metrics_cb.losses_epoch
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(train, color='tab:blue', alpha=0.25, lw=0.8, label='train (per batch)')
    ax.plot(smooth(train), color='tab:blue', lw=2, label='train (smoothed)')
    if epochs:
        per_epoch = len(train) / len(epochs)
        xs = [(i+1)*per_epoch for i in range(len(epochs))]
        valid = [e.get('valid') for e in epochs]
        pts = [(x, float(v)) for x, v in zip(xs, valid) if v is not None]
        if pts:
            ax.plot(*zip(*pts), 'o-', color='tab:orange', lw=2, label='valid (per epoch)')
    ax.set_xlabel('training batch'); ax.set_ylabel('cross-entropy loss')
    ax.set_title('aisaac demo: Fashion-MNIST, get_model_conv, 3 epochs')
    ax.grid(alpha=0.3); ax.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(); fig.savefig(path, dpi=120); plt.close(fig)
    return path


# Parse the arguments before the (slower) library import, so that --help is instant.
args = parse_args()

from aisaac.all import *  # the public API, exactly as in the README

start = time.time()
set_seed(42)
xmean,xstd = 0.28, 0.35
@inplace
def tfm(b): b['image'] = [(pil_to_tensor(o)-xmean)/xstd for o in b['image']]
dsd = load_fashion_mnist().with_transform(tfm)
dls = (DataLoaders.from_dataset_dict(dsd, 64, fast=True) if args.fast
       else DataLoaders.from_dataset_dict(dsd, 64))
trainer = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.Adam, model=get_model_conv(),
                  callbacks=[BasicTrainCB(), MetricsCB(Accuracy=MulticlassAccuracy()), DeviceCB(), ProgressCB()])
trainer.fit()
print(f'training took {time.time()-start:.0f} s')

path = plot_losses(trainer.MetricsCB, args.out)
print(f'loss curve saved to {path}')
