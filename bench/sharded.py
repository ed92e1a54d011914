#!/usr/bin/env python
"""Sharded training on 2 CPU processes (torchrun, gloo): per-step time and peak memory per process of a GPT, data parallel (DDP)
against FSDP2 (`FSDPCB`) against FSDP2 with activation checkpointing (`ActivationCheckpointCB`); and aisaac's FSDP loop against the
same steps written by hand (`fully_shard` per block, AdamW, forward, loss, backward, step, zero_grad), interleaved.

    python bench/sharded.py [--quick] [--loop-only] [--repeats N]

Each of the three settings runs in fresh processes (`torchrun --nproc_per_node 2`, launched by this script), so that each
process's peak resident memory (`VmHWM`: `ru_maxrss` would keep, across `exec`, a larger parent's) is that setting's (it includes PyTorch itself, ~350 MiB, and the whole model each
process makes before it is sharded); the table also gives the MiB of weights, gradients and AdamW state a process holds; the comparison with the hand-written loop runs both loops in the
same two processes, alternating, the median of the per-repeat ratios. The GPT: 4 blocks of width 384, 6 heads, sequences of 64
tokens, vocabulary 256 (7.2M parameters: 29 MB of fp32 weights, 115 MB with gradients and AdamW's two moments); 4 sequences per
process a step (a global batch of 8), AdamW; 1 torch thread per process.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time, types
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(Path(__file__).parents[1]))  # this checkout's aisaac
from aisaac.trainer import Trainer
from aisaac.models import GPT, lm_loss
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.sharding import FSDPCB, ActivationCheckpointCB

VOCAB, T, BS = 256, 64, 4  # BS: sequences per process a step

def make_model(): torch.manual_seed(0); return GPT(VOCAB, n_layer=4, n_head=6, d_model=384, block_size=T)

def loader(steps):
    "`steps` batches of `BS` sequences for this process"
    world = dist.get_world_size()
    toks = torch.randint(0, VOCAB, (steps * BS * world, T + 1), generator=torch.Generator().manual_seed(0))
    ds = TensorDataset(toks[:, :-1], toks[:, 1:])
    return DataLoader(ds, BS, sampler=DistributedSampler(ds, shuffle=False))

def aisaac_fit(setting, model, dl):
    "Seconds per step of one aisaac epoch over `dl` in `setting` ('ddp', 'fsdp', 'fsdp+ac')"
    cbs = [BasicTrainCB()] + ([FSDPCB()] if 'fsdp' in setting else []) + ([ActivationCheckpointCB()] if '+ac' in setting else [])
    t = Trainer(types.SimpleNamespace(train=dl, valid=None), lm_loss, torch.optim.AdamW, model, callbacks=cbs)
    dist.barrier(); start = time.perf_counter()
    t.fit(1, lr=1e-3, valid=False)
    return (time.perf_counter() - start) / len(dl), t

def state_mib(t):
    "MiB of this process's weights, gradients (as large as the weights) and optimizer state: its shards under FSDP"
    local = lambda x: x.to_local() if hasattr(x, 'to_local') else x
    params = sum(local(p).numel() * p.element_size() for p in t.model.parameters())
    opt = sum(local(v).numel() * v.element_size() for st in t.opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim())
    return (2 * params + opt) / 2**20

def hand_fit(model, dl):
    "Seconds per step of the same epoch written by hand, on a model sharded by hand, with a new optimizer (as each fit makes one)"
    dist.barrier(); start = time.perf_counter()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for x, y in dl:
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return (time.perf_counter() - start) / len(dl)

def child(setting, steps, reps, out):
    "In each of the 2 processes: the setting's per-step times (after a warm-up epoch) and peak memory"
    dist.init_process_group('gloo')
    torch.set_num_threads(1)
    dl, rank = loader(steps), dist.get_rank()
    res = {}
    if setting == 'aisaac vs hand':
        from torch.distributed.fsdp import fully_shard
        ours, hand = make_model(), make_model()
        for b in hand.blocks: fully_shard(b)
        fully_shard(hand)
        aisaac_fit('fsdp', ours, dl); hand_fit(hand, dl)  # warm-up
        times, ratios = {'aisaac': [], 'hand': []}, []
        for r in range(reps):
            order = ('aisaac', 'hand') if r % 2 else ('hand', 'aisaac')
            now = {n: aisaac_fit('fsdp', ours, dl)[0] if n == 'aisaac' else hand_fit(hand, dl) for n in order}
            for n in now: times[n].append(now[n])
            ratios.append(now['aisaac'] / now['hand'])
        res = {'times': times, 'ratios': ratios}
    else:
        model = make_model()
        if setting == 'ddp': model = nn.parallel.DistributedDataParallel(model)
        aisaac_fit(setting, model, dl)  # warm-up (and the sharding)
        runs = [aisaac_fit(setting, model, dl) for _ in range(reps)]
        res = {'times': [r[0] for r in runs], 'state_mib': state_mib(runs[-1][1])}
    res['maxrss_mib'] = int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1]) / 1024  # this process's own peak
    (Path(out)/f'{rank}.json').write_text(json.dumps(res))
    dist.destroy_process_group()

def launch(setting, steps, reps):
    "Run `setting` in 2 fresh processes; both processes' results"
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', __file__, '--child', setting,
               '--steps', str(steps), '--repeats', str(reps), '--out', d]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, 'OMP_NUM_THREADS': '1'})
        return [json.loads((Path(d)/f'{r}.json').read_text()) for r in range(2)]

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--quick', action='store_true'); ap.add_argument('--child'); ap.add_argument('--out')
    ap.add_argument('--steps', type=int, default=8); ap.add_argument('--repeats', type=int, default=5)
    ap.add_argument('--loop-only', action='store_true', help="only aisaac's FSDP loop against the hand-written one")
    a = ap.parse_args()
    if a.child: child(a.child, a.steps, a.repeats, a.out); sys.exit()
    steps, reps = (4, 2) if a.quick else (a.steps, a.repeats)
    print(f"# GPT 4x384 (7.2M parameters), T={T}, {BS} sequences per process a step, AdamW, 2 processes (gloo), 1 torch thread each; torch {torch.__version__}; "
          f"{steps} steps a repeat, median of {reps} repeats")
    print("\n| setting | ms/step (rank 0) | ms/step (rank 1) | peak RSS rank 0 (MiB) | peak RSS rank 1 (MiB) | weights + gradients + AdamW state per process (MiB) |\n|---|---|---|---|---|---|")
    for setting in () if a.loop_only else ('ddp', 'fsdp', 'fsdp+ac'):
        r = launch(setting, steps, reps)
        print(f"| {setting} | {statistics.median(r[0]['times'])*1e3:.0f} | {statistics.median(r[1]['times'])*1e3:.0f} | "
              f"{r[0]['maxrss_mib']:.0f} | {r[1]['maxrss_mib']:.0f} | {r[0]['state_mib']:.1f} |", flush=True)
    r = launch('aisaac vs hand', steps, max(reps, 2))
    print(f"\n| loop (FSDP2) | ms/step (rank 0) | ratio to hand (median of repeats, rank 0) | spread of ratios |\n|---|---|---|---|")
    for n in ('hand', 'aisaac'):
        ts, rs = r[0]['times'][n], r[0]['ratios']
        print(f"| {n} | {statistics.median(ts)*1e3:.1f} | {1.0 if n == 'hand' else statistics.median(rs):.3f} | "
              f"{'' if n == 'hand' else f'{min(rs):.3f} to {max(rs):.3f}'} |")
    print("\ntarget: aisaac at most 1.05x the hand-written loop")
