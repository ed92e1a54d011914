"""Post-training benchmarks (issue 49), each as ratios measured in one run, the variants interleaved:

    python bench/posttrain.py chunked [--widths 192 768] [--repeats 3]   # the chunked loss against the plain one
    python bench/posttrain.py dpo [--repeats 3]                          # a DPO step against an SFT step on the same tokens

`chunked`: the language-model loss at GPT-2's vocabulary (50,257 tokens) on 4 rows of 512 positions, every position labelled, from
hidden states of each width (`--widths`) through an output layer without bias: `lm_loss` on the whole logits (the plain path)
against `chunked_lm_loss` (the gradient in the forward pass, and `recompute=True`). Per variant: the memory the loss keeps for its
backward pass (saved-tensor hooks, its inputs and the weight left out: they exist anyway), the peak of the memory allocated during
its forward and backward passes (PyTorch's profiler, the weight's gradient included), and the time of a forward and backward pass
(median over the repeats; the ratio is the median of each repeat's ratio to the plain path of the same repeat).
Targets: peak memory <= 1/4 of the plain path's, time <= 1.1x.

`dpo`: the fine-tuning tutorial's GPT (4 blocks of 192, a vocabulary of 2,048, a context of 128) on random pairs of the shape of the
WordNet ones (prompts of 12-20 tokens, replies of 10-40), 16 pairs a batch, padded, AdamW: a step of `PreferenceCB` (DPO) against the
reference's log-probabilities computed once (`precompute_reference`), and against a live frozen copy, each against an SFT step
(`BasicTrainCB`, `lm_loss`) on a batch of the same 32 sequences (each pair's prompt + chosen and prompt + rejected, the prompt masked).
Per variant the median time of a step (the first 2 of each run left out); the ratio is the median of each repeat's ratio to the SFT step.
Targets: DPO with precomputed log-probabilities <= 2.2x the SFT step, with a live reference <= 3.2x.
"""
import argparse, random, statistics, sys, time
from pathlib import Path
import torch
import torch.nn.functional as F
from torch import nn
sys.path.insert(0, str(Path(__file__).parent))
from _common import machine
from aisaac.models import lm_loss
from aisaac.chunked import chunked_lm_loss

V, B, T = 50257, 4, 512

def saved_bytes(f, *inputs):
    "The bytes of the tensors that `f()`'s backward pass keeps, besides `inputs`; then its backward"
    seen, have = {}, {t.untyped_storage().data_ptr() for t in inputs}
    def pack(t):
        if (p := t.untyped_storage().data_ptr()) not in have: seen[p] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t): loss = f()
    loss.backward()
    return sum(seen.values())

def peak_bytes(f):
    "The peak of the memory allocated (above what was allocated before) during `f()` and its backward pass, from the profiler's allocation events"
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = f(); loss.backward(); del loss
    cur = top = 0
    for e in sorted((e for e in prof.profiler.kineto_results.events() if e.name() == '[memory]'), key=lambda e: e.start_ns()):
        cur += e.nbytes(); top = max(top, cur)
    return top

def chunked_bench(widths, repeats, chunk):
    print(f"# {machine()}\n# vocabulary {V:,}, {B}x{T} positions (all labelled), chunks of {chunk} positions; {repeats} repeats, interleaved\n")
    rows = []
    for d in widths:
        torch.manual_seed(0)
        h, head, y = torch.randn(B, T, d, requires_grad=True), nn.Linear(d, V, bias=False), torch.randint(0, V, (B, T))
        variants = {'plain (lm_loss)': lambda: lm_loss(head(h), y),
                    'chunked': lambda: chunked_lm_loss(h, head, y, chunk, 'mean'),
                    'chunked, recompute': lambda: chunked_lm_loss(h, head, y, chunk, 'mean', recompute=True)}
        def clear(): h.grad = None; head.weight.grad = None
        mem = {}
        for k, f in variants.items():
            clear(); kept = saved_bytes(f, h, head.weight, y)
            clear(); mem[k] = (kept, peak_bytes(f))
        clear(); ref = variants['plain (lm_loss)'](); ref.backward(); g_ref = (h.grad.clone(), head.weight.grad.clone())
        for k, f in list(variants.items())[1:]:
            clear(); loss = f(); loss.backward()
            err = max((loss - ref).abs().item() / ref.abs().item(), *((a - b).abs().max().item() for a, b in zip((h.grad, head.weight.grad), g_ref)))
            print(f"# width {d}, {k}: loss {loss.item():.6f} (plain {ref.item():.6f}); largest difference (loss relative, gradients absolute) {err:.1e}")
        times, ratios = {k: [] for k in variants}, {k: [] for k in variants}
        for r in range(repeats + 1):  # the first repeat warms up, and is not counted
            got = {}
            for k in random.sample(list(variants), len(variants)):
                clear(); t0 = time.perf_counter(); variants[k]().backward(); got[k] = time.perf_counter() - t0
            if r == 0: continue
            for k in variants: times[k].append(got[k]); ratios[k].append(got[k] / got['plain (lm_loss)'])
            print(f"#   width {d}, repeat {r}: " + ', '.join(f"{k} {v:.2f} s" for k, v in got.items()), flush=True)
        for k in variants:
            kept, peak = mem[k]
            rows.append((d, k, kept / 2**20, kept / mem['plain (lm_loss)'][0], peak / 2**20, peak / mem['plain (lm_loss)'][1],
                         statistics.median(times[k]), statistics.median(ratios[k])))
    print("\n| width | variant | kept for backward | ratio | peak | ratio | s per step | ratio |\n|---|---|---|---|---|---|---|---|")
    for d, k, kept, kr, peak, pr, t, tr in rows:
        print(f"| {d} | {k} | {kept:.1f} MiB | {kr:.3f} | {peak:.1f} MiB | {pr:.3f} | {t:.2f} | {tr:.3f} |")
    print("\nTargets: peak <= 0.25 of the plain path's, time <= 1.1x")

def _pairs(n, V, seed=0):
    "`n` tokenized pairs of random ids, of the WordNet pairs' shape"
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi, (), generator=g))
    out = []
    for _ in range(n):
        ex = {'prompt': torch.randint(1, V, (r(12, 21),), generator=g).tolist()}
        for k in ('chosen', 'rejected'): ex[k] = torch.randint(1, V, (r(10, 41),), generator=g).tolist(); ex[f'{k}_labels'] = list(ex[k])
        out.append(ex)
    return out

def dpo_bench(repeats, batches=12, bs=16):
    from aisaac.core.callback import Callback
    from aisaac.data import DataLoaders, TensorLoader
    from aisaac.models import get_model_gpt
    from aisaac.pairs import PairBatch, pad_pairs
    from aisaac.sft import SFTBatch, pad_examples
    from aisaac.trainer import Trainer
    from aisaac.callbacks.train import BasicTrainCB
    from aisaac.callbacks.preference import PreferenceCB, precompute_reference
    V, L = 2048, 129
    pairs = _pairs(bs * batches, V)
    rows = pad_pairs(pairs, 0, L)
    pair_dls = DataLoaders(TensorLoader(*rows, bs=bs, tfm=PairBatch()), TensorLoader(*rows, bs=bs, tfm=PairBatch()))
    seqs = [{'input_ids': ex['prompt'] + ex[k], 'labels': [-100] * len(ex['prompt']) + ex[f'{k}_labels']} for ex in pairs for k in ('chosen', 'rejected')]
    sft_dls = DataLoaders(TensorLoader(*pad_examples(seqs, 0, L), bs=2 * bs, tfm=SFTBatch()), TensorLoader(*pad_examples(seqs, 0, L), bs=2 * bs, tfm=SFTBatch()))
    torch.manual_seed(0)
    base = get_model_gpt(V, n_layer=4, n_head=4, d_model=192, block_size=128)
    pre_dls = precompute_reference(pair_dls, base)
    class Times(Callback):
        order = 100
        def __init__(self): self.t = []
        def before_batch(self, trainer): self.t0 = time.perf_counter()
        def after_batch(self, trainer): self.t.append(time.perf_counter() - self.t0)
    import copy
    def step(name):
        cb = Times()
        dls, main = {'SFT (BasicTrainCB)': (sft_dls, BasicTrainCB()), 'DPO, precomputed reference': (pre_dls, PreferenceCB()),
                     'DPO, live reference': (pair_dls, PreferenceCB(reference='copy'))}[name]
        t = Trainer(dls, lm_loss if name.startswith('SFT') else None, torch.optim.AdamW, copy.deepcopy(base), callbacks=[main, cb])
        t.fit(1, valid=False)
        return statistics.median(cb.t[2:])
    names = ['SFT (BasicTrainCB)', 'DPO, precomputed reference', 'DPO, live reference']
    print(f"# {machine()}\n# GPT 4x192, vocabulary {V}, {bs} pairs (32 rows) of up to {L - 1} tokens a batch, {batches} batches a run; {repeats} repeats, interleaved\n")
    times, ratios = {k: [] for k in names}, {k: [] for k in names}
    for r in range(repeats):
        got = {k: step(k) for k in random.sample(names, len(names))}
        for k in names: times[k].append(got[k]); ratios[k].append(got[k] / got[names[0]])
        print(f"#   repeat {r + 1}: " + ', '.join(f"{k} {got[k] * 1000:.0f} ms" for k in names), flush=True)
    print("\n| variant | ms per step | ratio to SFT | target |\n|---|---|---|---|")
    for k, target in zip(names, ('', '<= 2.2', '<= 3.2')):
        print(f"| {k} | {statistics.median(times[k]) * 1000:.0f} | {statistics.median(ratios[k]):.3f} | {target} |")

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('what', choices=['chunked', 'dpo'])
    p.add_argument('--widths', type=int, nargs='+', default=[192, 768], help='hidden widths of the chunked benchmark (default 192 768)')
    p.add_argument('--chunk', type=int, default=512, help='positions per chunk (default 512)')
    p.add_argument('--repeats', type=int, default=3, help='timed repeats (default 3)')
    p.add_argument('--threads', type=int, default=0, help="torch.set_num_threads (default 0: torch's default)")
    a = p.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    random.seed(0)
    if a.what == 'chunked': chunked_bench(a.widths, a.repeats, a.chunk)
    else: dpo_bench(a.repeats)
