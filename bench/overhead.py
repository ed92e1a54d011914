#!/usr/bin/env python
"""Per-batch overhead of the aisaac loop against a hand-written PyTorch loop, on a tiny MLP.

Workload: nn.Sequential(Linear(20,64), ReLU, Linear(64,10)) on 20k in-memory random rows, CrossEntropy,
SGD lr 0.01, one shuffled training epoch per timing (`fit(1, valid=False)` for aisaac), batch 16 and 64.
All variants run in one process, interleaved (a new random order every repeat); each cell is the median
over the repeats. Every repeat trains a fresh copy of the same initial model on a new loader (trainers keep
their callbacks and dispatch tables), so where tensors land in memory changes from repeat to repeat instead of
favouring one variant for the whole run. `ratio` is the median over the repeats of the variant's time over the raw loop's (torch
DataLoader) in the same repeat, at the same batch size: pairing within a repeat cancels the slow drifts of a
shared machine's speed.

Variants
  raw DataLoader      zero_grad/forward/loss/backward/step over a torch DataLoader(TensorDataset, shuffle=True)
  raw again           a second, identical raw DataLoader loop: its ratio shows this run's noise floor
  raw slicing         the same loop over slices of the tensors, shuffled once per epoch
  BasicTrainCB        Trainer with only BasicTrainCB, same torch DataLoader
  CoreCBs             Trainer with CoreCBs(progress=False, activation_stats=False) (DeviceCB, BasicTrainCB, MetricsCB), same DataLoader
  CoreCBs fast        CoreCBs(progress=False, activation_stats=False) over aisaac's TensorLoader(shuffle=True)
  CoreCBs + control   CoreCBs(progress=False, activation_stats=False) with OneCycleSchedulerCB(cycle_momentum=False), GradClipCB(1.0),
                      TerminateOnNaNCB, and EarlyStoppingCB and ThresholdStopperCB watching train_loss (never
                      triggered), same DataLoader. (cycle_momentum=False: cycling momentum would turn the plain SGD of
                      every other variant into SGD with momentum, a different and costlier optimizer step.)
  raw + control       the raw DataLoader loop doing the same work by hand: OneCycleLR stepped per batch,
                      clip_grad_norm_(1.0), and the loss read to check it is finite; `ctl/raw+` is the ratio of
                      `CoreCBs + control` to it, aisaac's own overhead on that work
  catalogue           CoreCBs(progress=False, activation_stats=False) (its MetricsCB included) with OneCycleSchedulerCB(cycle_momentum=False),
                      GradClipCB(1.0), TerminateOnNaNCB, CSVLogger, JSONLinesLogger (every value, per batch too), SpeedMonitorCB and
                      LRMonitorCB, same DataLoader: the catalogue a user turns on
  raw + catalogue     the raw DataLoader loop doing that work by hand: the schedule, clipping and finite-loss check of `raw + control`,
                      the batch losses kept on the device and averaged by size at the end (MetricsCB), the LR and momentum the step
                      used and the window throughput every batch once 100 are timed, each recorded in a dict of lists and written as a
                      JSON line, the epoch's throughput and loss as a JSON line and a CSV file (LRMonitorCB, SpeedMonitorCB,
                      JSONLinesLogger, CSVLogger); `cat/raw+` is the ratio of `catalogue` to it
  CoreCBs + stats     CoreCBs(progress=False): the above plus ActivationStatsCB on every module (AIsaac's default), same DataLoader
  observability       CoreCBs(progress=False) with activation stats, CSVLogger and JSONLinesLogger (files in a temporary
                      folder; JSON lines for every value, per batch too), LRMonitorCB, SpeedMonitorCB, RuntimeEstimatorCB,
                      GradNormCB and MemoryMonitorCB, same DataLoader
  Basic + 20 no-op    BasicTrainCB and 20 callbacks whose before_batch and after_batch do nothing, same DataLoader
  Basic + 20 quiet    BasicTrainCB and 20 callbacks with no per-batch hook (the same per-batch code as BasicTrainCB)
  --decompose adds:
  trainer, bare loop     a Trainer whose epoch is `for batch in dl:` with the steps inline: no per-batch event
  trainer, inline        the Trainer's loop (dataloader events, batch phase, checkpoint) with the steps inline

A second table isolates the dispatch cost (no model, no data loading): a Trainer whose only work callback
does nothing, over a list of pre-made batches, with and without the 20 no-op callbacks. That difference is
the per-batch cost of the 20 callbacks measured without the noise of the training step.

Run: `python bench/overhead.py` (about 2 minutes), `--quick` for a smoke run (about 20 s).
"""
import argparse, collections, copy, csv, gc, json, math, random, statistics, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's aisaac, also without `pip install -e`

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _common import machine
from aisaac.all import Callback, CancelBatchException, CancelEpochException, Trainer, with_cbs
from aisaac.callbacks.train import BasicTrainCB
from aisaac.groups import CoreCBs
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.schedule import OneCycleSchedulerCB
from aisaac.callbacks.gradients import GradClipCB
from aisaac.callbacks.stoppers import TerminateOnNaNCB, EarlyStoppingCB, ThresholdStopperCB
from aisaac.callbacks.loggers import CSVLogger, JSONLinesLogger
from aisaac.callbacks.monitors import LRMonitorCB, SpeedMonitorCB, RuntimeEstimatorCB, GradNormCB, MemoryMonitorCB

N_ROWS, N_IN, N_HID, N_OUT, LR = 20_000, 20, 64, 10, 0.01


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--quick', action='store_true', help='few repeats and batch 64 only, for a smoke run')
    p.add_argument('--repeats', type=int, default=None, help='timed epochs per variant (default 21, quick 3)')
    p.add_argument('--bs', type=int, nargs='+', default=None, help='batch sizes (default 16 64)')
    p.add_argument('--clock', choices=['cpu', 'wall'], default='cpu',
                   help="'cpu': this process's CPU time (default; time other jobs take from the machine is not counted), 'wall': elapsed time")
    p.add_argument('--threads', type=int, default=1, help='torch.set_num_threads (default 1: less noise; 0 = leave as is)')
    p.add_argument('--decompose', action='store_true', help='add two stripped-down trainers that show where the BasicTrainCB overhead goes')
    return p.parse_args()




class NoopCB(Callback):
    "A callback that listens to two per-batch events and does nothing"
    def before_batch(self, trainer): pass
    def after_batch(self, trainer): pass


class QuietCB(Callback):
    "A callback with no per-batch hook (it only listens to `before_fit`): what most callbacks look like per batch"
    def before_fit(self, trainer): pass


class NullTrainCB(Callback):
    "Stands in for BasicTrainCB with no work at all: only the loop's dispatch is left"
    core = True
    def predict(self, trainer): pass
    def get_loss(self, trainer): pass
    def backward(self, trainer): pass
    def step(self, trainer): pass
    def zero_grad(self, trainer): pass


def inline_steps(t):
    "BasicTrainCB's five steps on trainer `t`, written out"
    t.preds = t.model(t.batch[0]); t.loss = t.loss_func(t.preds, t.batch[1])
    t.loss.backward(); t.opt.step(); t.opt.zero_grad()


class InlineStepsTrainer(Trainer):
    "`--decompose`: the loop's events and phases, with the training steps written inline instead of in callbacks"
    @with_cbs('batch', CancelBatchException)
    def one_batch(self): inline_steps(self)


class BareLoopTrainer(Trainer):
    "`--decompose`: a Trainer whose epoch is a plain loop over the batches, with no per-batch event"
    @with_cbs('epoch', CancelEpochException)
    def _batches(self):
        for self.batch in self.dl: inline_steps(self)
    _one_epoch = _batches  # its name before the kernel (aisaac 0.0.1 of 2026-11-25), so that this bench runs on both


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(N_IN, N_HID), nn.ReLU(), nn.Linear(N_HID, N_OUT))


def raw_dl_epoch(model, dl, loss_func):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model.train()
    for xb, yb in dl:
        opt.zero_grad()
        loss = loss_func(model(xb), yb)
        loss.backward()
        opt.step()


def raw_control_epoch(model, dl, loss_func):
    "`raw_dl_epoch` with what `CoreCBs + control` adds: a one-cycle schedule, gradient clipping and a finite-loss check"
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=len(dl), cycle_momentum=False)
    params = list(model.parameters())
    model.train()
    for xb, yb in dl:
        opt.zero_grad()
        loss = loss_func(model(xb), yb)
        if not math.isfinite(loss.item()): break
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()


def raw_catalogue_epoch(model, dl, loss_func, path):
    "`raw_control_epoch` with what `catalogue` adds, written by hand: loss bookkeeping, the LR, momentum and throughput records, a JSON-lines log, a CSV of the epoch"
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=len(dl), cycle_momentum=False)
    params, history = list(model.parameters()), collections.defaultdict(list)
    losses, sizes, window, wsecs, wn = [], [], collections.deque(maxlen=100), 0., 0  # the window's sums kept as it slides
    model.train()
    with open(path, 'w') as log:
        start = last = time.perf_counter()
        for step, (xb, yb) in enumerate(dl):
            opt.zero_grad()
            loss = loss_func(model(xb), yb)
            if not math.isfinite(loss.item()): break
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            g = opt.param_groups[0]
            rec = {'lr': g['lr'], 'momentum': g['momentum']}  # what the step used (LRMonitorCB: SGD's group has a momentum)
            for k, v in rec.items(): history[k].append((step, v))
            log.write(json.dumps({'per': 'batch', 'step': step} | rec) + '\n')
            sched.step()
            losses.append(loss.detach()); sizes.append(len(yb))
            now = time.perf_counter()
            if full := len(window) == window.maxlen: wsecs, wn = wsecs - window[0][0], wn - window[0][1]
            window.append((now - last, len(yb)))
            wsecs, wn, last = wsecs + now - last, wn + len(yb), now
            if full or len(window) == window.maxlen:
                rec = {'samples_per_sec': wn / wsecs, 'batches_per_sec': len(window) / wsecs}
                for k, v in rec.items(): history[k].append((step, v))
                log.write(json.dumps({'per': 'batch', 'step': step} | rec) + '\n')
        secs = last - start
        row = {'epoch_samples_per_sec': sum(sizes) / secs, 'epoch_batches_per_sec': len(sizes) / secs, 'train_time': secs}
        row['train_loss'] = ((torch.stack(losses).float() * torch.tensor(sizes)).sum() / sum(sizes)).item()
        log.write(json.dumps({'per': 'epoch', 'step': 0} | row) + '\n')
    with open(path + '.csv', 'w', newline='') as f:  # the CSV file of the epoch rows
        w = csv.writer(f); w.writerow(['epoch', *row]); w.writerow([0, *row.values()])


def catalogue_cbs():
    "The catalogue variant's callbacks"
    return [CoreCBs(device='cpu', progress=False, activation_stats=False), OneCycleSchedulerCB(cycle_momentum=False), GradClipCB(1.0),
            TerminateOnNaNCB(), CSVLogger(f'{LOG_DIR.name}/cat_epochs.csv'), JSONLinesLogger(f'{LOG_DIR.name}/cat_log.jsonl'),
            SpeedMonitorCB(), LRMonitorCB()]


def control_cbs():
    "The training-control callbacks of the `CoreCBs + control` variant"
    return [CoreCBs(device='cpu', progress=False, activation_stats=False), OneCycleSchedulerCB(cycle_momentum=False), GradClipCB(1.0), TerminateOnNaNCB(),
            EarlyStoppingCB(patience=1000, watch_metric='train_loss'), ThresholdStopperCB('train_loss', 0.)]


def raw_slice_epoch(model, x, y, bs, loss_func):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model.train()
    idx = torch.randperm(len(x))
    xs, ys = x[idx], y[idx]
    for i in range(0, len(xs), bs):
        xb, yb = xs[i:i+bs], ys[i:i+bs]
        opt.zero_grad()
        loss = loss_func(model(xb), yb)
        loss.backward()
        opt.step()


LOG_DIR = tempfile.TemporaryDirectory(prefix='aisaac-bench-')

def observability_cbs():
    "CoreCBs with activation statistics, two file loggers and every monitor"
    return [CoreCBs(device='cpu', progress=False), CSVLogger(f'{LOG_DIR.name}/epochs.csv'), JSONLinesLogger(f'{LOG_DIR.name}/log.jsonl'),
            LRMonitorCB(), SpeedMonitorCB(), RuntimeEstimatorCB(), GradNormCB(), MemoryMonitorCB()]


def variants(x, y, bs, decompose=False):
    "name -> `prepare()`, which makes a fresh copy of the model and a new loader and returns the function that trains one epoch"
    loss_func, base = nn.CrossEntropyLoss(), make_model()
    dl = lambda: DataLoader(TensorDataset(x, y), batch_size=bs, shuffle=True)
    def raw(epoch):
        def prepare():
            model, loader = copy.deepcopy(base), dl()
            return lambda: epoch(model, loader)
        return prepare
    def trainer(cbs, fast=False, cls=Trainer):
        t = cls(DataLoaders([], []), loss_func, torch.optim.SGD, model=base, callbacks=cbs)  # its dispatch table persists
        def prepare():
            loader = TensorLoader(x, y, bs=bs, shuffle=True) if fast else dl()
            t.model, t.dls = copy.deepcopy(base), DataLoaders(loader, loader)
            return lambda: t.fit(1, lr=LR, valid=False)
        return prepare
    extra = {'trainer, bare loop': trainer([], cls=BareLoopTrainer), 'trainer, inline': trainer([], cls=InlineStepsTrainer)}
    return (extra if decompose else {}) | {
        'raw DataLoader': raw(lambda m, d: raw_dl_epoch(m, d, loss_func)),
        'raw again': raw(lambda m, d: raw_dl_epoch(m, d, loss_func)),
        'raw slicing': raw(lambda m, d: raw_slice_epoch(m, x, y, bs, loss_func)),
        'BasicTrainCB': trainer([BasicTrainCB()]),
        'CoreCBs': trainer([CoreCBs(device='cpu', progress=False, activation_stats=False)]),
        'CoreCBs fast': trainer([CoreCBs(device='cpu', progress=False, activation_stats=False)], fast=True),
        'CoreCBs + control': trainer(control_cbs()),
        'raw + control': raw(lambda m, d: raw_control_epoch(m, d, loss_func)),
        'catalogue': trainer(catalogue_cbs()),
        'raw + catalogue': raw(lambda m, d: raw_catalogue_epoch(m, d, loss_func, f'{LOG_DIR.name}/raw_cat.jsonl')),
        'CoreCBs + stats': trainer([CoreCBs(device='cpu', progress=False)]),
        'observability': trainer(observability_cbs()),
        'Basic + 20 no-op': trainer([BasicTrainCB()] + [NoopCB() for _ in range(20)]),
        'Basic + 20 quiet': trainer([BasicTrainCB()] + [QuietCB() for _ in range(20)]),
    }


def dispatch_variants(bs, n_batches):
    batches = [(torch.zeros(bs, N_IN), torch.zeros(bs, dtype=torch.long))] * n_batches
    def trainer(cbs):
        t = Trainer(DataLoaders(batches, batches), nn.CrossEntropyLoss(), torch.optim.SGD, model=make_model(), callbacks=cbs)
        return lambda: lambda: t.fit(1, lr=LR, valid=False)
    return {'dispatch only': trainer([NullTrainCB()]),
            'dispatch + 20 no-op': trainer([NullTrainCB()] + [NoopCB() for _ in range(20)]),
            'dispatch + 20 quiet': trainer([NullTrainCB()] + [QuietCB() for _ in range(20)])}


CLOCK = time.process_time

def time_interleaved(preps, repeats, warmup=1):
    "Seconds of each variant's run (a list per variant), in a new random order every repeat, each run prepared just before"
    times = {k: [] for k in preps}
    for r in range(warmup + repeats):
        order = list(preps)
        random.shuffle(order)
        for k in order:
            run = preps[k]()  # new model and loader: where they land in memory changes every repeat
            gc.collect()
            t0 = CLOCK()
            run()
            dt = CLOCK() - t0
            if r >= warmup: times[k].append(dt)
    return times


def main():
    args = parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == 'cpu' else time.perf_counter
    if args.threads: torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if args.quick else 21)
    sizes = args.bs or ([64] if args.quick else [16, 64])
    n_rows = 5_000 if args.quick else N_ROWS
    random.seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n_rows, N_IN, generator=g), torch.randint(0, N_OUT, (n_rows,), generator=g)

    print(f"# aisaac loop overhead: tiny MLP {N_IN}-{N_HID}-{N_OUT}, {n_rows} rows, SGD, 1 training epoch per timing")
    print(f"# {machine()}")
    print(f"# median of {repeats} interleaved repeats (after 1 warm-up), {args.clock} time; "
          f"ratio = median over repeats of time / raw DataLoader loop's time in the same repeat\n")
    hdr = f"| {'batch':>5} | {'variant':<20} | {'s/epoch':>8} | {'us/batch':>9} | {'ratio':>6} | {'spread':>7} |"
    print(hdr); print('|' + '|'.join('-' * (len(c)) for c in hdr.split('|')[1:-1]) + '|')
    results = {}
    for bs in sizes:
        n_batches = -(-n_rows // bs)
        times = time_interleaved(variants(x, y, bs, args.decompose), repeats)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = {k: statistics.median(a / b for a, b in zip(v, times['raw DataLoader'])) for k, v in times.items()}
        for k, v in times.items():
            spread = (max(v) - min(v)) / med[k]
            print(f"| {bs:>5} | {k:<20} | {med[k]:8.4f} | {med[k]/n_batches*1e6:9.1f} | {ratio[k]:6.3f} | {spread:6.1%} |")
        results[bs] = {k: v / n_batches * 1e6 for k, v in med.items()} | {f'{k} ratio': v for k, v in ratio.items()}
        results[bs]['control vs raw+'] = statistics.median(a / b for a, b in zip(times['CoreCBs + control'], times['raw + control']))
        print(f"| {bs:>5} | {'ctl/raw+ (ratio)':<20} | {'':>8} | {'':>9} | {results[bs]['control vs raw+']:6.3f} | {'':>7} |")
        results[bs]['catalogue vs raw+'] = statistics.median(a / b for a, b in zip(times['catalogue'], times['raw + catalogue']))
        print(f"| {bs:>5} | {'cat/raw+ (ratio)':<20} | {'':>8} | {'':>9} | {results[bs]['catalogue vs raw+']:6.3f} | {'':>7} |")
        # the no-op cost, paired per repeat (same repeat, adjacent in time) to cancel slow drifts
        results[bs]['noop_paired'] = statistics.median(
            (a - b) / n_batches * 1e6 for a, b in zip(times['Basic + 20 no-op'], times['BasicTrainCB']))

    print(f"\n# dispatch cost alone (no model, no data loading: a no-op train callback over a list of batches)\n")
    hdr2 = f"| {'variant':<20} | {'us/batch':>9} |"
    print(hdr2); print('|' + '|'.join('-' * (len(c)) for c in hdr2.split('|')[1:-1]) + '|')
    n_disp = 1000 if args.quick else 5000
    dt = time_interleaved(dispatch_variants(64, n_disp), repeats * 2)
    disp = {k: statistics.median(v) / n_disp * 1e6 for k, v in dt.items()}
    added = {k: statistics.median((a - b) / n_disp * 1e6 for a, b in zip(dt[k], dt['dispatch only'])) for k in dt}  # paired per repeat
    for k, v in disp.items(): print(f"| {k:<20} | {v:9.2f} |")

    if 64 in results:
        r = results[64]
        noop_total, quiet_total = added['dispatch + 20 no-op'], added['dispatch + 20 quiet']
        checks = [
            ('BasicTrainCB-only <= 1.03x raw loop (bs 64)', r['BasicTrainCB ratio'], 1.03, 'x'),
            ('CoreCBs minus display <= 1.10x raw loop (bs 64)', r['CoreCBs ratio'], 1.10, 'x'),
            ('CoreCBs fast path <= 0.75x raw loop (bs 64)', r['CoreCBs fast ratio'], 0.75, 'x'),
            ('CoreCBs + scheduler, clipping, stoppers <= 1.10x raw loop (bs 64)', r['CoreCBs + control ratio'], 1.10, 'x'),
            ('CoreCBs + control vs the raw loop doing the same work <= 1.10x (bs 64)', r['control vs raw+'], 1.10, 'x'),
            ('the catalogue vs the raw loop doing the same work <= 1.05x (bs 64)', r['catalogue vs raw+'], 1.05, 'x'),
            ('20 quiet callbacks (no per-batch hook) add <= 2 us/batch (dispatch-only measure)', quiet_total, 2.0, ' us'),
            ('20 no-op callbacks with 2 per-batch hooks each (40 calls) add <= 2 us/batch', noop_total, 2.0, ' us'),
        ]
        print(f"\n# targets (batch 64)\n")
        for name, val, lim, unit in checks:
            print(f"- {name}: {val:.3f}{unit} -> {'MET' if val <= lim else 'MISSED'}")
        print(f"- (noise floor: the identical second raw loop measured {r['raw again ratio']:.3f}x)")
        print(f"- (observability: CoreCBs with activation stats, CSV and JSON-lines loggers and the five monitors: "
              f"{r['observability ratio']:.3f}x; CoreCBs with activation stats alone: {r['CoreCBs + stats ratio']:.3f}x; for reference)")
        print(f"- (20 no-op callbacks in the full workload, paired median: {r['noop_paired']:+.1f} us/batch; "
              f"noisy, for reference)")


if __name__ == '__main__':
    main()
