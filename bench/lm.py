#!/usr/bin/env python
"""Tokens per second of the language-model tutorial's recipe: aisaac against a hand-written loop doing the same work.

The recipe `nbs/tutorials/language_model.ipynb` was saved with until 2026-12-05 (the page now trains batches of 16 without dropout,
AdamW's weight decay 0.3, for 3,200 steps: `bench/README.md`; this one is kept so that its figures, the GPU page's among them, stay
comparable): a small GPT (`get_model_gpt(2048, n_layer=4, n_head=4, d_model=192, dropout=0.1)`,
2.2M parameters) on blocks of 128 tokens of the fortunes corpus, batches of 32 blocks as dicts from the tensor fast path,
AdamW (fused: `partial(torch.optim.AdamW, fused=True)`, as the tutorials build it), linear warm-up then cosine decay stepped every batch, bfloat16 autocast for the forward pass and the loss,
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

`--sft`: the fine-tuning recipe of `nbs/tutorials/fine_tuning.ipynb` with packing on: the same GPT, optimizer, schedule,
precision and clipping, on WordNet's glosses as prompt/response pairs (`wordnet_glosses`, the first `--examples` training
examples, 20,000 by default), tokenized with the fortunes tokenizer, packed by `sft_dataloaders(pack=True)` into rows of
128 inputs: batches `{'input_ids', 'labels', 'position_ids'}`, labels -100 on the prompts and between documents, the
model's attention kept inside each document. Both variants pass the inputs by name (`model(input_ids=..., position_ids=...)`);
tokens/s counts the rows' positions (about 95 % of them real tokens when packed).

`--parts`: where a batch of the recipe's GPT spends its time (forward + backward, clipping, the optimizer step), with
`torch.optim.AdamW` built plainly (on a CPU, a Python loop over the tensors), `foreach=True` and `fused=True`, alternately.

`--decay`: what leaving biases, norms and embeddings out of the weight decay does to the recipe (`aisaac.params`, on by default:
`trainer.no_decay`). The recipe trained for `--batches` optimizer steps (its warm-up and cosine laid over them, 5 % warm-up), from one
initial model and seed, with and without those groups, at AdamW's default weight decay (0.01, the tutorial's) and at nanoGPT's 0.1; the
validation loss (the whole validation split, token-weighted) after each run. `--repeats` seeds per setting.

`--hf` (needs `transformers`): the peer. A `transformers` GPT-2 of the same size (4 layers x 192, 4 heads, 128 positions,
dropout 0.1, built from a config, no download) trained on the same blocks for the same batches, five ways, interleaved:

  raw loop        the steps written out, with the recipe's fused AdamW
  aisaac          the tutorial's trainer as above, as a user runs it (fused AdamW), `lm_loss` on the model's `logits`
  aisaac plain    the same with `opt_func=torch.optim.AdamW` as constructed by default (on a CPU: its for-loop implementation)
  HF plain        `transformers.Trainer` given that same plain optimizer and schedule (`optimizers=(AdamW, LambdaLR)`)
  HF defaults     `transformers.Trainer` with its defaults: its fused AdamW (`optim='adamw_torch_fused'`), weight decay 0,
                  its own data loader (`default_data_collator` over a dataset of blocks); told only the learning rate, the
                  warm-up + cosine schedule, `max_grad_norm=1` (its default), `bf16`, `max_steps`, no reporting, no progress bar

All compute `lm_loss` on the same pre-shifted labels (the HF Trainer through `compute_loss_func`). `--precision fp32`,
`bf16` (autocast, the default) or `both`. Each variant's time is its whole `fit`/`train()` call (set-up included) over
the batches; the ratios are medians of per-repeat ratios to the raw loop of the same repeat.
"""
import argparse, copy, random, statistics, sys, tempfile, time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's aisaac, also without `pip install -e`

import torch

from _common import Stop, bench_args, interleaved, machine
from aisaac.core.callback import Callback, CancelFitException
from aisaac.trainer import Trainer
from aisaac.utils import set_seed
from aisaac.models import get_model_gpt, lm_loss
from aisaac.text import load_text_corpus, train_tokenizer, text_dataloaders
from aisaac.sft import wordnet_glosses, sft_dataloaders
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.schedule import WarmupCosineSchedulerCB, warmup_cosine
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.callbacks.gradients import GradClipCB

OPT = partial(torch.optim.AdamW, fused=True)  # the tutorials' optimizer: one kernel for all parameters (torch's default on a CPU loops over them)
BS, T, LR, STEPS, WARMUP = 32, 128, 2e-3, 2300, 100  # the schedule is laid out for the tutorial's steps; a run trains only its first batches

def sync(dev):
    if dev.type == 'cuda': torch.cuda.synchronize(dev)

def logits_of(out): return getattr(out, 'logits', out)  # a `transformers` model returns an output with `logits`

def raw(model, dl, n, dev, amp=True, opt_func=OPT):
    "The hand-written loop: `n` training batches of the recipe; seconds per batch"
    opt = opt_func(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, STEPS, WARMUP))
    losses = []
    model.train()
    sync(dev); t0, i = time.perf_counter(), 0
    while True:
        for b in dl:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                loss = lm_loss(logits_of(model(**{k: v for k, v in b.items() if k != 'labels'})), b['labels'])  # by name, as BasicTrainCB
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step(); opt.zero_grad(); sched.step()
            losses.append(loss.detach())
            i += 1
            if i == n:
                sync(dev)
                return (time.perf_counter() - t0) / n

def aisaac(model, dls, n, dev, amp=True, opt_func=OPT):
    "The tutorial's trainer: `n` training batches; seconds per batch"
    trainer = Trainer(dls, lambda out, labels: lm_loss(logits_of(out), labels), opt_func, model,
                      callbacks=[BasicTrainCB(), MetricsCB(show=False), WarmupCosineSchedulerCB(warmup=WARMUP), GradClipCB(1.0), Stop(n)]
                                + ([MixedPrecisionCB(torch.bfloat16)] if amp else []))
    sync(dev); t0 = time.perf_counter()
    trainer.fit(steps=STEPS, lr=LR, valid=False)
    sync(dev)
    return (time.perf_counter() - t0) / n

class Blocks(torch.utils.data.Dataset):
    "The training blocks as a map-style dataset of dicts, for Hugging Face's Trainer and its default collator"
    def __init__(self, blocks): self.blocks = blocks
    def __len__(self): return len(self.blocks)
    def __getitem__(self, i): return {'input_ids': self.blocks[i, :-1], 'labels': self.blocks[i, 1:]}

def hf_trainer(model, blocks, n, dev, amp=True, same_opt=False):
    "Hugging Face's Trainer for `n` batches: with its defaults, or given torch's plain AdamW and the recipe's schedule (`same_opt`); seconds per batch"
    from transformers import Trainer as HFTrainer, TrainingArguments, PrinterCallback
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, per_device_train_batch_size=BS, max_steps=n, learning_rate=LR, lr_scheduler_type='cosine',
                                 warmup_steps=WARMUP, bf16=amp, use_cpu=dev.type == 'cpu', report_to='none', disable_tqdm=True,
                                 save_strategy='no', seed=torch.initial_seed() % 2**32)
        opts = (None, None)
        if same_opt:
            opt = torch.optim.AdamW(model.parameters(), lr=LR)
            opts = (opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, STEPS, WARMUP)))
        t = HFTrainer(model=model, args=args, train_dataset=Blocks(blocks), optimizers=opts,
                      compute_loss_func=lambda out, labels, num_items_in_batch=None: lm_loss(out.logits, labels))
        t.remove_callback(PrinterCallback)  # its one print of the run's summary (the progress bar is off)
        sync(dev); t0 = time.perf_counter()
        t.train()
        sync(dev)
    return (time.perf_counter() - t0) / n

def hf_peer(dls, vocab_size, reps, n, dev, precisions):
    "The same `transformers` GPT-2 trained by the raw loop, aisaac and Hugging Face's Trainer, interleaved; print a table per precision"
    from transformers import GPT2Config, GPT2LMHeadModel
    set_seed(1)
    cfg = GPT2Config(vocab_size=vocab_size, n_positions=T, n_embd=192, n_layer=4, n_head=4, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                     bos_token_id=0, eos_token_id=0)
    base = GPT2LMHeadModel(cfg).to(dev)
    blocks = dls.train.tensors[0]
    print(f"# the peer: a transformers {transformers_version()} GPT-2 4x192 ({sum(p.numel() for p in base.parameters()):,} parameters), "
          f"{BS} blocks of {T} tokens, {reps} repeats of {n} batches, on {dev.type}; times include each fit's set-up")
    raw(copy.deepcopy(base), dls.train, 3, dev)  # warm-up
    for prec in precisions:
        amp = prec == 'bf16'
        variants = {'raw loop': lambda m: raw(m, dls.train, n, dev, amp),
                    'aisaac': lambda m: aisaac(m, dls, n, dev, amp),
                    'aisaac plain': lambda m: aisaac(m, dls, n, dev, amp, opt_func=torch.optim.AdamW),
                    'HF plain': lambda m: hf_trainer(m, blocks, n, dev, amp, same_opt=True),
                    'HF defaults': lambda m: hf_trainer(m, blocks, n, dev, amp)}
        times, ratios = {k: [] for k in variants}, {k: [] for k in variants}
        for r in range(reps):
            res = {}
            for name in random.sample(list(variants), len(variants)):
                set_seed(100 + r)
                res[name] = variants[name](copy.deepcopy(base))
                print(f"#     {prec} {name}: {res[name]*1000:.0f} ms/batch", flush=True)
                times[name].append(res[name])
            for k in variants: ratios[k].append(res[k] / res['raw loop'])
            print(f"#   {prec} repeat {r+1}: " + ', '.join(f"{k} {v*1000:.0f} ms" for k, v in res.items()), flush=True)
        print(f"\n{prec}:\n| variant      | tokens/s | ms/batch | ratio to raw | per-repeat ratios |\n|---|---|---|---|---|")
        for k in variants:
            med = statistics.median(times[k])
            print(f"| {k:<12} | {BS * T / med:8.0f} | {med*1000:8.1f} | {statistics.median(ratios[k]):.3f} | "
                  f"{', '.join(f'{x:.3f}' for x in ratios[k])} |", flush=True)

def parts(base, dl, dev, n):
    "Where a batch's time goes: forward + backward, clipping, and the optimizer step as torch builds AdamW plainly, foreach and fused"
    print(f"# where the time goes: medians over {n} batches after 5 of warm-up, ms")
    print("\n| AdamW | forward + backward | clip | optimizer step + zero_grad |\n|---|---|---|---|")
    for name, kw in [('plain', {}), ('foreach', {'foreach': True}), ('fused', {'fused': True})] * 2:
        model = copy.deepcopy(base).train()
        opt = torch.optim.AdamW(model.parameters(), lr=LR, **kw)
        ts, it = [], iter(dl)
        for i in range(n + 5):
            b = next(it, None) or next(it := iter(dl))
            sync(dev); t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = lm_loss(model(b['input_ids']), b['labels'])
            loss.backward(); sync(dev); t1 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); sync(dev); t2 = time.perf_counter()
            opt.step(); opt.zero_grad(); sync(dev); t3 = time.perf_counter()
            if i >= 5: ts.append((t1 - t0, t2 - t1, t3 - t2))
        print(f"| {name} | " + ' | '.join(f'{statistics.median(x) * 1000:.1f}' for x in zip(*ts)) + ' |', flush=True)

def decay_runs(base, dls, n, dev, reps):
    "The recipe for `n` steps with and without the no-decay groups, at weight decay 0.01 and 0.1: each run's validation loss, and the table"
    print(f"# the language-model tutorial's recipe (GPT 4x192, fused AdamW, warm-up + cosine over {n} steps, bf16, clipping), "
          f"{BS} blocks of {T} tokens, {reps} seed(s), on {dev.type}\n# {machine()}")
    res = {}
    for wd in (0.01, 0.1):
        for no_decay in (True, False):
            for seed in range(reps):
                set_seed(100 + seed)
                t = Trainer(dls, lm_loss, partial(OPT, weight_decay=wd), copy.deepcopy(base),
                            callbacks=[BasicTrainCB(), MetricsCB(show=False), WarmupCosineSchedulerCB(warmup=0.05), GradClipCB(1.0), MixedPrecisionCB(torch.bfloat16)])
                t.no_decay = no_decay
                t0 = time.perf_counter()
                t.fit(steps=n, lr=LR)
                loss = t.history.get_metric_values('valid_loss')[-1]
                res.setdefault((wd, no_decay), []).append(loss)
                print(f"#   weight decay {wd}, no-decay groups {'on ' if no_decay else 'off'}, seed {seed}: valid loss {loss:.4f} "
                      f"({len(t.opt.param_groups)} parameter groups, {time.perf_counter() - t0:.0f} s)", flush=True)
    print("\n| weight decay | no-decay groups (default) | all decayed (before) | difference |\n|---|---|---|---|")
    for wd in (0.01, 0.1):
        on, off = statistics.mean(res[wd, True]), statistics.mean(res[wd, False])
        print(f"| {wd} | {on:.4f} | {off:.4f} | {on - off:+.4f} |")
    return res

def transformers_version():
    import transformers
    return transformers.__version__

def main():
    own = argparse.ArgumentParser(add_help=False)  # this script's options; the shared ones (and --help) are bench_args'
    own.add_argument('--hf', action='store_true'); own.add_argument('--precision', choices=['fp32', 'bf16', 'both'], default='bf16')
    own.add_argument('--sft', action='store_true'); own.add_argument('--examples', type=int, default=20_000)
    own.add_argument('--parts', action='store_true'); own.add_argument('--decay', action='store_true')
    opts, sys.argv[1:] = own.parse_known_args()
    hf, precisions = opts.hf, (['fp32', 'bf16'] if opts.precision == 'both' else [opts.precision])
    reps, n, quick, dev = bench_args(__doc__, '2 repeats of 8 batches', device=True)
    dsd = load_text_corpus()
    tok = train_tokenizer(dsd['train'], vocab_size=2048)
    dls = text_dataloaders(dsd, tok, block_size=T, bs=BS, seed=0, device=dev)
    if opts.sft:
        gl = wordnet_glosses()
        gl['train'] = gl['train'].select(range(min(opts.examples, len(gl['train']))))
        dls = sft_dataloaders(gl, tok, block_size=T, bs=BS, pack=True, seed=0, device=dev)
        real = (dls.train.tensors[1] != -100).float().mean().item()
    if hf: return hf_peer(dls, tok.get_vocab_size(), reps, n, dev, precisions)
    set_seed(1)
    base = get_model_gpt(tok.get_vocab_size(), n_layer=4, n_head=4, d_model=192, block_size=T, dropout=0.1).to(dev)
    if opts.parts: return parts(base, dls.train, dev, n)
    if opts.decay: return decay_runs(base, dls, n, dev, 1 if quick else reps)
    raw(copy.deepcopy(base), dls.train, 10, dev)  # warm-up: torch's first-call costs, oneDNN's kernel choices
    what = (f"the fine-tuning recipe, packed (WordNet glosses, {len(dls.train.tensors[0]):,} rows, {real:.0%} of positions a trained label)"
            if opts.sft else "the language-model tutorial's recipe")
    print(f"# {what} (GPT 4x192, fused AdamW, warm-up + cosine, bf16, clipping), {BS} blocks of {T} tokens, "
          f"{reps} repeats of {n} training batches, on {dev.type}")
    print(f"# {machine()}" + (f", {torch.cuda.get_device_name(dev)}, CUDA {torch.version.cuda}" if dev.type == 'cuda' else ''))
    interleaved(lambda m: raw(m, dls.train, n, dev), lambda m: aisaac(m, dls, n, dev), base, reps, per_batch=BS * T)

if __name__ == '__main__':
    main()
