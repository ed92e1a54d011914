#!/usr/bin/env python
"""Tokens per second of the language-model tutorial's recipe: aisaac against a hand-written loop doing the same work.

The recipe of `nbs/tutorials/language_model.ipynb`: a small GPT (`get_model_gpt(2048, n_layer=4, n_head=4, d_model=192, dropout=0.1)`,
2.2M parameters) on blocks of 128 tokens of the fortunes corpus, batches of 32 blocks as dicts from the tensor fast path,
AdamW, linear warm-up then cosine decay stepped every batch, bfloat16 autocast for the forward pass and the loss,
gradients clipped to norm 1, the training loss kept per batch.

  raw loop   the same steps written out: autocast forward and loss, backward, clip, step, zero_grad, scheduler step,
             the loss appended (detached, on the device)
  aisaac     Trainer with BasicTrainCB, MetricsCB (token-weighted loss), WarmupCosineSchedulerCB, MixedPrecisionCB and
             GradClipCB: the tutorial's callbacks without the display, the samples and the monitors

Both read the same `TensorLoader`, in one process. Each repeat trains a fresh copy of one initial model for `--batches`
batches (a training-only fit cancelled after that many), the two variants in random order; the figure is the median
over repeats of the tokens per second, and the ratio the median of the per-repeat ratios of seconds per batch.

On a GPU (`--device cuda`, the default where there is one) the model and both splits' blocks are on the GPU, autocast is
bfloat16 there too (as the tutorial on a CPU; `MixedPrecisionCB(torch.bfloat16)`, no scaler), and each timing ends with a
device sync.

Run: `python bench/lm.py` (about two minutes on 2 cores), `--repeats`, `--batches`, `--quick`, `--device`.
"""
import copy, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's aisaac, also without `pip install -e`

import torch

from _common import Stop, bench_args, interleaved, machine
from aisaac.core.callback import Callback, CancelFitException
from aisaac.trainer import Trainer
from aisaac.utils import set_seed
from aisaac.models import get_model_gpt, lm_loss
from aisaac.text import load_text_corpus, train_tokenizer, text_dataloaders
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.schedule import WarmupCosineSchedulerCB, warmup_cosine
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.callbacks.gradients import GradClipCB

BS, T, LR, STEPS, WARMUP = 32, 128, 2e-3, 2300, 100  # the schedule is laid out for the tutorial's steps; a run trains only its first batches

def sync(dev):
    if dev.type == 'cuda': torch.cuda.synchronize(dev)

def raw(model, dl, n, dev):
    "The hand-written loop: `n` training batches of the recipe; seconds per batch"
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, STEPS, WARMUP))
    losses = []
    model.train()
    sync(dev); t0, i = time.perf_counter(), 0
    while True:
        for b in dl:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = lm_loss(model(b['input_ids']), b['labels'])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step(); opt.zero_grad(); sched.step()
            losses.append(loss.detach())
            i += 1
            if i == n:
                sync(dev)
                return (time.perf_counter() - t0) / n

def aisaac(model, dls, n, dev):
    "The tutorial's trainer: `n` training batches; seconds per batch"
    trainer = Trainer(dls, lm_loss, torch.optim.AdamW, model,
                      callbacks=[BasicTrainCB(), MetricsCB(show=False), WarmupCosineSchedulerCB(warmup=WARMUP), MixedPrecisionCB(torch.bfloat16),
                                 GradClipCB(1.0), Stop(n)])
    sync(dev); t0 = time.perf_counter()
    trainer.fit(steps=STEPS, lr=LR, valid=False)
    sync(dev)
    return (time.perf_counter() - t0) / n

def main():
    reps, n, quick, dev = bench_args(__doc__, '2 repeats of 8 batches', device=True)
    dsd = load_text_corpus()
    tok = train_tokenizer(dsd['train'], vocab_size=2048)
    dls = text_dataloaders(dsd, tok, block_size=T, bs=BS, seed=0, device=dev)
    set_seed(1)
    base = get_model_gpt(tok.get_vocab_size(), n_layer=4, n_head=4, d_model=192, block_size=T, dropout=0.1).to(dev)
    raw(copy.deepcopy(base), dls.train, 10, dev)  # warm-up: torch's first-call costs, oneDNN's kernel choices
    print(f"# the language-model tutorial's recipe (GPT 4x192, AdamW, warm-up + cosine, bf16, clipping), {BS} blocks of {T} tokens, "
          f"{reps} repeats of {n} training batches, on {dev.type}")
    print(f"# {machine()}" + (f", {torch.cuda.get_device_name(dev)}, CUDA {torch.version.cuda}" if dev.type == 'cuda' else ''))
    interleaved(lambda m: raw(m, dls.train, n, dev), lambda m: aisaac(m, dls, n, dev), base, reps, per_batch=BS * T)

if __name__ == '__main__':
    main()
