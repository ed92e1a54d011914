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

`--resume`: how long a fit that resumes inside an epoch takes to reach its first batch, from a checkpoint at 10 %, 50 % and 90 % of
an epoch of `--epoch-batches` batches (20,000 by default; 8 rows of 16 numbers each) loaded by 2 worker processes: torch's
`DataLoader`, which replays the batches already trained (fetches them and drops them), against torchdata's `StatefulDataLoader`,
whose state is in the checkpoint. The checkpoints come from one training run of each (a linear model), the resumes are timed from
`fit(resume_from=...)` to the first training batch, interleaved, `--repeats` times (the replay at 90 % once unless more are asked).

`--shards`: tokens per second of the language-model recipe (`bench/lm.py`'s: GPT 4x192, fused AdamW, warm-up + cosine, bf16,
clipping, batches of 32 blocks of 128 tokens) reading its blocks from an in-memory tensor (`text_dataloaders`) against token shards on
disk (`text_dataloaders(shards=...)`, `ShardLoader`'s random blocks), interleaved; timed in this process's CPU seconds (all its
threads), which other jobs on the machine do not add to; then each loader alone, 200 batches.

`--memory`: the peak memory (ru_maxrss) of a process that trains the same recipe for `--batches` batches from a generated token
corpus of 100 MB and of 2 GB (uint16 ids in shards of 64 MiB), and of the process that wrote it; the corpora are deleted after.
"""
import argparse, gc, random, shutil, statistics, sys, time, types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's aisaac, also without `pip install -e`

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from _common import machine, tfm
from aisaac.utils import set_seed
from aisaac.core.callback import Callback, CancelFitException
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
    p.add_argument('--resume', action='store_true', help='resume time of a replayed and a stateful loader, 2 workers')
    p.add_argument('--epoch-batches', type=int, default=20_000, help='--resume: batches in the epoch (default 20,000)')
    p.add_argument('--shards', action='store_true', help='the language-model recipe from memory and from token shards')
    p.add_argument('--memory', action='store_true', help='peak memory training from a 100 MB and a 2 GB token corpus')
    p.add_argument('--batches', type=int, default=30, help='--shards, --memory: training batches per repeat (default 30)')
    p.add_argument('--memory-child', nargs=3, help=argparse.SUPPRESS)
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
    if args.resume: return resume_bench(args)
    if args.shards: return shards_bench(args)
    if args.memory: return memory_bench(args)
    if args.memory_child: return memory_child(*args.memory_child)
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


# ---------------------------------------------------------------- --resume
class Rows(torch.utils.data.Dataset):
    "`n` rows of 16 numbers and a target, made from the index (no storage)"
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
    def __getitem__(self, i):
        x = torch.full((16,), i / self.n)
        return x, x[:1]

class SaveAt(Callback):
    "Write a checkpoint after each training batch of `at` (batch numbers of the first epoch), then stop after the last"
    def __init__(self, at, dir): self.at, self.dir, self.paths = at, dir, {}
    def checkpoint(self, trainer, at):
        if at == 'batch' and trainer.batch_num + 1 in self.at:
            self.paths[trainer.batch_num + 1] = trainer.save_checkpoint(self.dir/f'at_{trainer.batch_num + 1}.pt')
            if trainer.batch_num + 1 == max(self.at): raise CancelFitException()

class FirstBatch(Callback):
    "Note when the first training batch arrives, and stop"
    def after_dataloader(self, trainer):
        self.t = time.perf_counter()
        raise CancelFitException()

def resume_trainer(kind, n, cbs=()):
    "A linear model trained on `Rows` through 2 workers: torch's `DataLoader` (replay) or torchdata's `StatefulDataLoader`"
    from torch import nn
    from aisaac.trainer import Trainer
    from aisaac.callbacks.train import BasicTrainCB
    torch.manual_seed(0)
    if kind == 'stateful':
        from torchdata.stateful_dataloader import StatefulDataLoader as Loader
    else: Loader = DataLoader
    dl = Loader(Rows(n * 8), batch_size=8, shuffle=True, num_workers=2)
    return Trainer(types.SimpleNamespace(train=dl, valid=[]), nn.MSELoss(), torch.optim.SGD, nn.Linear(16, 1), callbacks=[BasicTrainCB(), *cbs])

def resume_bench(args):
    import tempfile, warnings
    warnings.filterwarnings('ignore', message='.*set_vital')
    warnings.filterwarnings('ignore', message='Resuming inside')
    n = 2000 if args.quick else args.epoch_batches
    at = [n // 10, n // 2, n * 9 // 10]
    tmp = Path(tempfile.mkdtemp())
    paths = {}
    for kind in ('replay', 'stateful'):
        (tmp/kind).mkdir()
        save = SaveAt(at, tmp/kind)
        t0 = time.perf_counter()
        t = resume_trainer(kind, n, [save])
        t.fit(1, lr=1e-3, valid=False)
        del t; gc.collect()
        print(f"# {kind}: trained {max(at):,} batches and wrote 3 checkpoints in {time.perf_counter() - t0:.0f} s", flush=True)
        paths[kind] = save.paths
    repeats = args.repeats or (1 if args.quick else 3)
    res = {(k, a): [] for k in paths for a in at}
    for r in range(repeats):
        for key in random.sample(list(res), len(res)):
            if key[0] == 'replay' and key[1] == at[-1] and r and not args.repeats: continue  # the long one once, unless asked
            first = FirstBatch()
            t = resume_trainer(key[0], n, [first])
            t0 = time.perf_counter()
            t.fit(1, lr=1e-3, valid=False, resume_from=paths[key[0]][key[1]])
            res[key].append(first.t - t0)
            del t; gc.collect()  # its workers end here, not in a later worker process that inherited the loader
            print(f"#   repeat {r + 1}: {key[0]} at batch {key[1]:,}: {res[key][-1]:.3f} s", flush=True)
    print(f"\n# resume inside an epoch of {n:,} batches (8 rows each), 2 worker processes: seconds from `fit(resume_from=...)` to the "
          f"first training batch, median of {repeats} (the replay at 90 %: {len(res[('replay', at[-1])])})")
    print(f"# {machine()}\n")
    print("| loader | at 10 % | at 50 % | at 90 % | 90 % / 10 % |\n|---|---|---|---|---|")
    for kind, name in (('replay', "torch `DataLoader` (today's replay)"), ('stateful', '`StatefulDataLoader` (its state)')):
        meds = [statistics.median(res[(kind, a)]) for a in at]
        print(f"| {name} | {meds[0]:.3f} s | {meds[1]:.3f} s | {meds[2]:.3f} s | {meds[2] / meds[0]:.2f}x |")
    ratio = statistics.median(res[('stateful', at[-1])]) / statistics.median(res[('stateful', at[0])])
    print(f"\n# target: stateful at 90 % within 2x of its figure at 10 %: {ratio:.2f}x -> {'MET' if ratio <= 2 else 'MISSED'}")
    shutil.rmtree(tmp, ignore_errors=True)

# ---------------------------------------------------------------- --shards and --memory: the language-model recipe
def lm_trainer_time(model, dls, n, cpu=False):
    "bench/lm.py's aisaac variant: seconds per batch of the recipe over `n` batches (`cpu`: this process's CPU seconds, which other jobs do not add to)"
    import lm
    t0 = time.process_time()
    wall = lm.aisaac(model, dls, n, torch.device('cpu'))
    return (time.process_time() - t0) / n if cpu else wall

def lm_model(vocab):
    import lm
    from aisaac.models import get_model_gpt
    set_seed(1)
    return get_model_gpt(vocab, n_layer=4, n_head=4, d_model=192, block_size=lm.T, dropout=0.1)

def shards_bench(args):
    import copy, tempfile
    import lm
    from aisaac.text import load_text_corpus, train_tokenizer, text_dataloaders
    dsd = load_text_corpus()
    tok = train_tokenizer(dsd['train'], vocab_size=2048)
    tmp = Path(tempfile.mkdtemp())
    variants = {'in-memory tensor': text_dataloaders(dsd, tok, block_size=lm.T, bs=lm.BS, seed=0),
                'token shards': text_dataloaders(dsd, tok, block_size=lm.T, bs=lm.BS, seed=0, shards=tmp)}
    base, n = lm_model(tok.get_vocab_size()), (8 if args.quick else args.batches)
    repeats = args.repeats or (2 if args.quick else 5)
    lm_trainer_time(copy.deepcopy(base), variants['token shards'], 5)  # warm-up
    times, ratios = {k: [] for k in variants}, []
    for r in range(repeats):
        res = {}
        for k in random.sample(list(variants), 2):
            set_seed(100 + r)
            res[k] = times[k].append(lm_trainer_time(copy.deepcopy(base), variants[k], n, cpu=True)) or times[k][-1]
        ratios.append(res['in-memory tensor'] / res['token shards'])
        print(f"#   repeat {r + 1}: in memory {res['in-memory tensor'] * 1e3:.1f} ms, shards {res['token shards'] * 1e3:.1f} ms CPU per batch, "
              f"throughput ratio {ratios[-1]:.3f}", flush=True)
    print(f"\n# the language-model recipe (bench/lm.py's aisaac variant: GPT 4x192, fused AdamW, warm-up + cosine, bf16, clipping), "
          f"{lm.BS} blocks of {lm.T} tokens, {repeats} repeats of {n} batches, interleaved\n# {machine()}\n")
    print("| blocks from | tokens per CPU second | CPU ms/batch |\n|---|---|---|")
    for k, ts in times.items(): print(f"| {k} | {lm.BS * lm.T / statistics.median(ts):,.0f} | {statistics.median(ts) * 1e3:.1f} |")
    for k, dls in variants.items():  # the loader alone: what it adds to a batch
        it, t0 = iter(dls.train), time.perf_counter()
        for _ in range(200): next(it)
        print(f"# {k}: {(time.perf_counter() - t0) / 200 * 1e3:.3f} ms to draw a batch alone")
    ratio = statistics.median(ratios)
    print(f"\n# target: throughput from shards >= 0.95x from memory (median of per-repeat ratios): {ratio:.3f}x -> {'MET' if ratio >= 0.95 else 'MISSED'}")
    shutil.rmtree(tmp, ignore_errors=True)

def memory_child(what, size, path):
    "In its own process: write a generated corpus of `size` bytes to `path` ('write'), or train the recipe from it ('train'); print the peak RSS"
    import resource
    from aisaac.shards import ShardLoader, TokenShards, write_token_shards
    n = int(size) // 2
    if what == 'write':
        chunks = (np.random.default_rng(i).integers(0, 2048, min(1 << 22, n - i * (1 << 22)), dtype=np.uint16) for i in range(-(-n // (1 << 22))))
        write_token_shards(chunks, path, vocab_size=2048, shard_tokens=1 << 25)
    else:
        import lm
        from aisaac.data import DataLoaders
        from aisaac.text import _Split
        sh = TokenShards(path)
        dls = DataLoaders(ShardLoader(sh, lm.T, lm.BS, shuffle=True, seed=0, tfm=_Split()), [])
        lm_trainer_time(lm_model(2048), dls, int(what.split(':')[1]))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)

def memory_bench(args):
    import subprocess, tempfile
    sizes = [100 << 20, 2 << 30] if not args.quick else [10 << 20, 100 << 20]
    tmp, n = Path(tempfile.mkdtemp(dir=Path(__file__).resolve().parents[1])), (5 if args.quick else args.batches)
    rows = []
    try:
        for size in sizes:
            path, peaks = tmp/f'corpus_{size >> 20}', []
            for what in ('write', f'train:{n}'):
                t0 = time.perf_counter()
                r = subprocess.run([sys.executable, __file__, '--memory-child', what, str(size), str(path)], capture_output=True, text=True)
                if r.returncode: raise RuntimeError(r.stderr[-3000:])
                peaks.append((float(r.stdout.split()[-1]), time.perf_counter() - t0))
            rows.append((size, peaks))
            print(f"#   {size >> 20:,} MiB: writer peak {peaks[0][0]:.0f} MiB ({peaks[0][1]:.0f} s), trainer peak {peaks[1][0]:.0f} MiB ({peaks[1][1]:.0f} s)", flush=True)
            shutil.rmtree(path)
    finally: shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n# peak resident memory (ru_maxrss) of a process writing a generated corpus of uint16 ids to shards of 64 MiB, and of one "
          f"training the language-model recipe on it for {n} batches of random blocks (ShardLoader)\n# {machine()}\n")
    print("| corpus | writer peak | trainer peak |\n|---|---|---|")
    for size, ((w, _), (t, _)) in rows: print(f"| {size >> 20:,} MiB | {w:.0f} MiB | {t:.0f} MiB |")
    (w0, _), (t0, _) = rows[0][1]
    (w1, _), (t1, _) = rows[-1][1]
    print(f"\n# target: the trainer's peak flat within 10 % from {sizes[0] >> 20:,} MiB to {sizes[-1] >> 20:,} MiB: {t1 / t0:.3f}x "
          f"-> {'MET' if t1 / t0 <= 1.10 else 'MISSED'} (the writer's: {w1 / w0:.3f}x)")


if __name__ == '__main__':
    main()
