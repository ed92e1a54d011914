#!/usr/bin/env python
"""What weight averaging (`EMACB`) and loss-spike watching (`LossSpikeCB`) cost per step on the language-model recipe.

The recipe is `bench/lm.py`'s: the tutorial's GPT (`get_model_gpt(2048, n_layer=4, n_head=4, d_model=192, dropout=0.1)`, 2.2M
parameters) on blocks of 128 tokens, batches of 32, fused AdamW, warm-up + cosine, bf16 autocast, clipping to norm 1, trained
by the tutorial's trainer (`bench/lm.py`'s `aisaac`). Random tokens stand in for the fortunes corpus: the time of a step does not
depend on the tokens.

  1. the update alone: `EMACB.update` (one `torch._foreach_lerp_` over the 2.2M parameters, and a copy of the integer buffers:
     the GPT has none) timed `--updates` times, against the median step of the trainer without it;
  2. one fit with `EMACB(decay=0.999)`, `LossSpikeCB()` (its default: 'rollback', a check every 25 steps, a snapshot every 100)
     and `LossSpikeCB('skip')` (a decision, so a host sync, every step), timed by `ProfileCB`: each callback's handlers per
     step, and their share of the fit. Measured inside one fit, the shares hold on a loaded machine, where whole-step timings
     do not (they vary by 2x from repeat to repeat on the shared 2-core machine);
  3. a checkpoint written in a fit with `LossSpikeCB`'s rollback (a snapshot every step, so that it holds the optimizer's state): its file size and the time `save_checkpoint` takes, with the rollback's snapshot in
     it (the default, `snapshot_in_checkpoint=True`: a resumed run rolls back where the uninterrupted one would) and without;
  4. with `--whole`: whole steps, interleaved, the trainer alone and with each of them.

Run: `python bench/averaging.py` (`--batches 100` passes four checks and a snapshot), `--repeats`, `--batches`, `--quick`, `--device`, `--whole`.
"""
import copy, random, statistics, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from _common import Stop, bench_args, machine
from lm import OPT, BS, T, LR, STEPS, WARMUP, sync
from aisaac.utils import set_seed
from aisaac.data import DataLoaders, TensorLoader
from aisaac.models import get_model_gpt, lm_loss
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.schedule import WarmupCosineSchedulerCB
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.callbacks.gradients import GradClipCB
from aisaac.callbacks.averaging import EMACB
from aisaac.callbacks.spikes import LossSpikeCB
from aisaac.callbacks.introspect import ProfileCB

def fit(model, dls, n, dev, extra, keep=None):
    "The tutorial's trainer with `extra` callbacks, for `n` training batches: seconds per batch (the trainer in `keep`, a list)"
    trainer = Trainer(dls, lm_loss, OPT, model, callbacks=[BasicTrainCB(), MetricsCB(show=False), WarmupCosineSchedulerCB(warmup=WARMUP),
                                                         GradClipCB(1.0), MixedPrecisionCB(torch.bfloat16), Stop(n), *extra()])
    sync(dev); t0 = time.perf_counter()
    trainer.fit(steps=STEPS, lr=LR, valid=False)
    sync(dev)
    if keep is not None: keep.append(trainer)
    return (time.perf_counter() - t0) / n

def main():
    whole = '--whole' in sys.argv
    if whole: sys.argv.remove('--whole')
    reps, n, quick, dev = bench_args(__doc__, '2 repeats of 8 batches', device=True)
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 2048, (BS * max(n, 8) * 2, T + 1), generator=g).to(dev)
    dls = DataLoaders(TensorLoader(blocks[:, :-1], blocks[:, 1:], bs=BS, shuffle=True, seed=0), TensorLoader(blocks[:BS, :-1], blocks[:BS, 1:], bs=BS))
    set_seed(1)
    base = get_model_gpt(2048, n_layer=4, n_head=4, d_model=192, block_size=T, dropout=0.1).to(dev)
    print(f"# the language-model recipe (GPT 4x192, {sum(p.numel() for p in base.parameters()):,} parameters, fused AdamW, bf16, clipping), "
          f"{BS} blocks of {T} tokens, {reps} repeats of {n} training batches, on {dev.type}\n# {machine()}")
    fit(copy.deepcopy(base), dls, 5, dev, list)  # warm-up

    ema = EMACB(decay=0.999)
    trainer = Trainer(dls, lm_loss, OPT, copy.deepcopy(base), callbacks=[ema])
    ema.update(trainer, live := ema._tensors(trainer))  # the first update copies
    ema.n_averaged, ts = 1, []
    for i in range((k := 20 if quick else 200)):
        sync(dev); t0 = time.perf_counter()
        ema.update(trainer, live)
        sync(dev); ts.append(time.perf_counter() - t0)
    upd = statistics.median(ts)
    step = statistics.median(fit(copy.deepcopy(base), dls, n, dev, list) for _ in range(reps))
    print(f"EMACB.update alone: {upd*1e6:.0f} us (median of {k}), {upd / step:.3%} of the trainer's step ({step*1000:.1f} ms, median of {reps} fits of {n} batches)", flush=True)

    kept = []
    fit(copy.deepcopy(base), dls, n, dev, lambda: [EMACB(decay=0.999), LossSpikeCB(), LossSpikeCB('skip'), ProfileCB()], keep=kept)
    prof = kept[0].ProfileCB
    print(f"\n{n} batches, one fit, ProfileCB: {prof.total / n * 1000:.1f} ms per step\n\n| callback | handlers' time per step | share of the fit |\n|---|---|---|")
    for name in ('EMACB', 'LossSpikeCB', 'LossSpikeCB_1'):
        secs = sum(s for e, c, _, s, _ in prof.stats if c == name)
        print(f"| {name}{' (skip)' if name.endswith('_1') else ''} | {secs / n * 1e6:.0f} us | {secs / prof.total:.3%} |", flush=True)
    print("\n| LossSpikeCB's rollback, checkpoint written in the fit | file | save_checkpoint, median of 5 |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        fit(copy.deepcopy(base), dls, max(n, 3), dev, lambda: [LossSpikeCB(check_every=1, snapshot_every=1), Saves(Path(d))])  # (a snapshot with the optimizer state)
    if whole: whole_steps(base, dls, n, dev, reps)

class Saves(Callback):
    "At the third training batch's `checkpoint` event (after `LossSpikeCB`'s snapshot), time `save_checkpoint` without and with the snapshot"
    order = 200
    def __init__(self, d): self.d = d
    def checkpoint(self, trainer, at):
        if at != 'batch' or trainer.batch_num != 2: return
        sizes = {}
        for inside in (False, True):
            trainer.LossSpikeCB.snapshot_in_checkpoint, ts = inside, []
            for i in range(5):
                t0 = time.perf_counter()
                path = trainer.save_checkpoint(self.d/f'{inside}_{i}.pt')
                ts.append(time.perf_counter() - t0)
            sizes[inside] = path.stat().st_size
            print(f"| {'with the snapshot (default)' if inside else 'without (`snapshot_in_checkpoint=False`)'} | {sizes[inside] / 2**20:.1f} MiB "
                  f"({sizes[inside] / sizes[False]:.2f}x) | {statistics.median(ts)*1000:.0f} ms |", flush=True)

def whole_steps(base, dls, n, dev, reps):
    "Whole steps, interleaved: the trainer alone and with each callback"
    variants = {'trainer': list, 'EMACB': lambda: [EMACB(decay=0.999)], 'LossSpikeCB()': lambda: [LossSpikeCB()],
                "LossSpikeCB('skip')": lambda: [LossSpikeCB('skip')]}
    times = {k: [] for k in variants}
    for r in range(reps):
        for name in random.sample(list(variants), len(variants)):
            set_seed(100 + r)
            times[name].append(fit(copy.deepcopy(base), dls, n, dev, variants[name]))
        print(f"#   repeat {r+1}: " + ', '.join(f"{k} {v[-1]*1000:.1f} ms" for k, v in times.items()), flush=True)
    print("\n| variant | ms/batch | vs the trainer alone (median of per-repeat ratios) | per-repeat ratios |\n|---|---|---|---|")
    for name, ts in times.items():
        ratios = [a / b for a, b in zip(ts, times['trainer'])]
        print(f"| {name} | {statistics.median(ts)*1000:.1f} | {statistics.median(ratios):.3f} | {', '.join(f'{x:.3f}' for x in ratios)} |")

if __name__ == '__main__':
    main()
