#!/usr/bin/env python
"""Crash anywhere, lose nothing: kill a training run with SIGKILL at random instants, restart it from `last_checkpoint`
each time, and compare where it ends with a run that was never interrupted.

The run (a child process, `--child`): a seeded MLP on synthetic data, `fit(steps=480, valid_every=60)` with Adam, a
one-cycle schedule, `MetricsCB`, `CheckpointCB(every='5 steps', every_n_epochs=None, keep_last=3)`, a `CSVLogger` (a row
per validation), a `JSONLinesLogger` (every value it is sent), a `ResultsFileCB` and (when tensorboard is installed) a
`TensorBoardLogger`, resumed with `resume_from=last_checkpoint(dir)`. At the end it writes the weights, the optimizer's state and the history to `final.pt`.

A trial: start the run in a fresh folder; once it has started training (it says so on stdout), read its progress (a line
per training batch: `step N`) up to a point drawn uniformly over what is left of its training, wait up to one checkpoint
interval more at the pace the run goes then, and SIGKILL it; restart it, and again, `--kills` times; then let it finish.
Each (re)start of a one-process run is a fork of this harness, which imported torch, its compiler front end and aisaac once
(`preload`): a process of its own, killed as any other, that shares nothing with the run before it but those imports
(`--fresh`: a new Python each time, as before 2026-12-03; `--quick` took 65 s so against 21 s forked, on the 2 loaded cores).
The kills fall at points of the run's own progress, so a loaded machine changes where they fall no more than a quiet one
(before 2026-12: instants drawn from the reference run's time, all after the end of a run slowed by the load). A kill that leaves a temporary file beside the checkpoints fell inside a checkpoint write. The trial is compared
with the uninterrupted run: the final weights and optimizer state bit for bit, the history, the CSV and JSON-lines files
line for line (rows lost: in the reference, not in the trial; duplicated: in the trial more often than in the reference),
the results file's records (one run, the same events and metrics; its times differ) and TensorBoard's scalars as
TensorBoard reads them.

`--loader stateful`: the training loader is torchdata's `StatefulDataLoader` with 2 worker processes (its state in the
checkpoints, as `TensorLoader`'s is by default); `--loader shards`: a small language model (an embedding and a linear layer,
dropout) on `ShardLoader`'s random blocks of token shards written once for all the trials.

`--background`: the checkpoints are written in the background (`CheckpointCB(background=True)`: the state copied at the event,
written, sealed and renamed by a background thread while the run goes on), so many kills fall while a write is under way.
`--upload`: each checkpoint is also uploaded to an fsspec URL (`file://` on this disk, `CheckpointCB(upload=...)`, with
`keep_last` there too), and every restart first deletes the local checkpoints (a machine that lost its disk) and resumes from
`last_checkpoint(url)`, which downloads the newest whole upload: a kill during an upload leaves the one before the newest.

`--slow-write S`: each checkpoint's write takes S seconds longer (a sleep in its seal, its temporary file written), and so does
each upload (a sleep after the copy to its temporary name): a stand-in for a large checkpoint on a slow disk or network, so that
many kills fall while a write or an upload is under way.

`--procs 2`: the same on two processes (torchrun, gloo, `DistributedDataParallel`, a `DistributedSampler` without
shuffling, no dropout: no random draw differs between the processes), where the main process writes the checkpoints and
the logs; a kill hits one process drawn at random (torchrun then stops the other), and the restart of both resumes from
the newest checkpoint, which only a finished write makes.

Seeded (`--seed`): the kill instants of trial `i` come from `random.Random(seed * 1000 + i)`, so a failing trial can be
replayed alone with `--trials 1 --first i`. Run: `python bench/chaos.py` (50 trials, 4 kills each: about 20 minutes on
2 cores), `--quick` (3 trials of 2 kills, for the tests).
"""
import argparse, json, os, random, shutil, signal, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's aisaac, also without `pip install -e`
STEPS, VALID_EVERY, EVERY = 480, 60, '5 steps'

def synthetic(torch):
    "The run's data: 4,096 training and 512 validation rows of 16 features, 3 classes, always the same"
    g = torch.Generator().manual_seed(0)
    x, xv = torch.randn(4096, 16, generator=g), torch.randn(512, 16, generator=g)
    label = lambda x: (x[:, :4].sum(1) > 0).long() + (x[:, 4] > 1).long()
    return x, label(x), xv, label(xv)

LOADER = 'tensor'  # the training loader (`--loader`): each says its state, which the checkpoints keep
BACKGROUND, UPLOAD, SLOW = False, False, 0.  # `--background`, `--upload`, `--slow-write`

def slow_writes(seconds):
    "Each checkpoint write (in its seal, with its temporary file there) and each upload (after the copy to its temporary name) takes `seconds` longer"
    if not seconds: return
    import fsspec.implementations.local as local
    import aisaac.persist as persist
    seal, put = persist.seal, local.LocalFileSystem.put
    def slow_seal(path): time.sleep(seconds); return seal(path)
    def slow_put(self, *args, **kwargs): res = put(self, *args, **kwargs); time.sleep(seconds); return res
    persist.seal, local.LocalFileSystem.put = slow_seal, slow_put

def saver(out:Path):
    "The run's `CheckpointCB`: every 5 steps, the last 3 kept; in the background, uploaded (to `out/remote`) and slowed as the options say"
    from aisaac.callbacks.savers import CheckpointCB
    slow_writes(SLOW)
    return CheckpointCB(out/'ckpt', every=EVERY, every_n_epochs=None, keep_last=3, background=BACKGROUND, upload=f'file://{out}/remote' if UPLOAD else None)

def resume_from(out:Path, rank:int=0):
    "The checkpoint a (re)start resumes from: the newest whole one in `out/ckpt`, or (`--upload`) downloaded from the URL, each process into its own cache"
    from aisaac.callbacks.savers import last_checkpoint
    return last_checkpoint(f'file://{out}/remote', cache=out/f'cache_{rank}') if UPLOAD else last_checkpoint(out/'ckpt')

def loaders(torch, nn, out):
    "The run's loaders and model: an MLP on `synthetic` from a `TensorLoader` or a `StatefulDataLoader` (2 workers); or a small language model from token shards"
    from aisaac.data import DataLoaders, TensorLoader
    x, y, xv, yv = synthetic(torch)
    mlp = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 3))
    if LOADER == 'tensor': return DataLoaders(TensorLoader(x, y, bs=64, shuffle=True, seed=1), TensorLoader(xv, yv, bs=256)), mlp
    if LOADER == 'stateful':
        import warnings
        from torch.utils.data import TensorDataset
        from torchdata.stateful_dataloader import StatefulDataLoader
        warnings.filterwarnings('ignore', message='.*set_vital')
        return DataLoaders(StatefulDataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, num_workers=2,
                                              generator=torch.Generator().manual_seed(1)), TensorLoader(xv, yv, bs=256)), mlp
    from aisaac.shards import ShardLoader, TokenShards, write_token_shards  # 'shards': 4,096 blocks of 17 ids of a 32-token vocabulary
    g = torch.Generator().manual_seed(0)
    for name, n in (('train', 4096), ('valid', 256)):
        if not (out.parent/f'shards_{name}').exists():  # (written once for all the trials, atomically: a kill leaves none)
            write_token_shards([torch.randint(0, 32, (n * 17,), generator=g)], out.parent/f'shards_{name}', vocab_size=32, shard_tokens=20_000)
    tfm = lambda b: (b[0][:, :-1], b[0][:, 1:].flatten())
    return (DataLoaders(ShardLoader(TokenShards(out.parent/'shards_train'), 16, 16, shuffle=True, seed=1, tfm=tfm),
                        ShardLoader(TokenShards(out.parent/'shards_valid'), 16, 64, tfm=tfm)),
            nn.Sequential(nn.Embedding(32, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 32), nn.Flatten(0, 1)))

def child(out:Path, steps:int):
    "The training run: resumes from the newest whole checkpoint in `out/ckpt`, if any; writes `out/final.pt` at the end"
    import torch
    from torch import nn
    from aisaac.core.callback import Callback
    from aisaac.trainer import Trainer
    from aisaac.utils import set_seed
    from aisaac.persist import atomic_save
    from aisaac.callbacks.train import BasicTrainCB
    from aisaac.callbacks.metrics import MetricsCB
    from aisaac.callbacks.schedule import OneCycleSchedulerCB
    from aisaac.callbacks.loggers import CSVLogger, JSONLinesLogger
    from aisaac.callbacks.results import ResultsFileCB
    torch.set_num_threads(1)
    class Ready(Callback):
        def before_fit(self, t): print('ready', flush=True)
        def after_batch(self, t):
            if t.model.training: print(f'step {t.clock.step}', flush=True)  # the run's progress: the trial kills by it
    try:
        from aisaac.callbacks.trackers import TensorBoardLogger
        tb = [TensorBoardLogger(out/'tb')]
    except ImportError: tb = []
    set_seed(0)
    dls, model = loaders(torch, nn, out)
    t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.Adam, model,
                callbacks=[BasicTrainCB(), MetricsCB(show=False), OneCycleSchedulerCB(),
                           saver(out), CSVLogger(out/'log.csv'), JSONLinesLogger(out/'log.jsonl'), ResultsFileCB(out/'results.jsonl'), *tb, Ready()])
    t.fit(steps=steps, valid_every=VALID_EVERY, lr=1e-2, resume_from=resume_from(out))
    atomic_save({'model': t.model.state_dict(), 'opt': t.opt.state_dict(), 'history': t.history.state_dict()}, out/'final.pt')

def child_ddp(out:Path, steps:int):
    "The training run on each of the processes torchrun started: DDP, the main process writing checkpoints and logs"
    import torch, torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler
    from aisaac.core.callback import Callback
    from aisaac.trainer import Trainer
    from aisaac.data import DataLoaders
    from aisaac.utils import set_seed
    from aisaac.persist import atomic_save
    from aisaac.callbacks.train import BasicTrainCB
    from aisaac.callbacks.metrics import MetricsCB
    from aisaac.callbacks.schedule import OneCycleSchedulerCB
    from aisaac.callbacks.loggers import CSVLogger, JSONLinesLogger
    torch.set_num_threads(1)
    dist.init_process_group('gloo')
    rank = dist.get_rank()
    class Ready(Callback):
        def before_fit(self, t):
            out.mkdir(parents=True, exist_ok=True); (out/f'pid_{rank}').write_text(str(os.getpid()))
            dist.barrier()
            if rank == 0: print('ready', flush=True)
        def after_batch(self, t):
            if rank == 0 and t.model.training: print(f'step {t.clock.step}', flush=True)  # the run's progress: the trial kills by it
    set_seed(0)
    x, y, xv, yv = synthetic(torch)
    dl = lambda ds, bs: DataLoader(ds, bs, sampler=DistributedSampler(ds, shuffle=False))
    dls = DataLoaders(dl(TensorDataset(x, y), 32), dl(TensorDataset(xv, yv), 128))
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3)))
    t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.Adam, model,
                callbacks=[BasicTrainCB(), MetricsCB(show=False), OneCycleSchedulerCB(),
                           saver(out), CSVLogger(out/'log.csv'), JSONLinesLogger(out/'log.jsonl'), Ready()])
    t.fit(steps=steps, valid_every=VALID_EVERY, lr=1e-2, resume_from=resume_from(out, rank))
    if rank == 0:
        atomic_save({'model': t.model.module.state_dict(), 'opt': t.opt.state_dict(), 'history': t.history.state_dict()}, out/'final.pt')
    dist.destroy_process_group()

PROCS = 1

FRESH = False  # `--fresh`: each (re)start of a one-process run is a new Python (imports included), not a fork of this one

def preload():
    "What a run imports before it trains (torch, its compiler front end, aisaac, tensorboard): once here, so that each forked run starts at once"
    import torch
    torch.set_num_threads(1)  # (before any op: no OpenMP team in this process, which a forked child could not use)
    import torch._dynamo  # noqa: F401 (the first optimizer step imports it: 1.2 s a start)
    import aisaac.trainer, aisaac.persist, aisaac.callbacks.savers, aisaac.callbacks.loggers, aisaac.callbacks.results  # noqa: F401
    import aisaac.callbacks.metrics, aisaac.callbacks.schedule, aisaac.data  # noqa: F401
    try: import aisaac.callbacks.trackers, torch.utils.tensorboard  # noqa: F401
    except ImportError: pass

class Forked:
    """A one-process run forked from this process, with what `start` reads of a `subprocess.Popen`: `stdout` (its lines), `pid`,
    `poll`, `wait`, `communicate`, `send_signal`, `returncode`. The child is a process of its own, killed as any other: it shares
    nothing with the run before it but the imports done here (`preload`), and ends as a Python does (exit functions, threads joined)"""
    def __init__(self, out:Path, steps:int):
        r, w = os.pipe()
        err = os.open(out/'stderr.txt', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pid = os.fork()
        if pid == 0:  # the run
            code = 1
            try:
                os.setsid(); os.close(r); os.dup2(w, 1); os.dup2(err, 2)
                sys.stdout, sys.stderr = open(1, 'w', buffering=1, closefd=False), open(2, 'w', buffering=1, closefd=False)
                try: child(out, steps); code = 0
                except SystemExit as e: code = e.code if isinstance(e.code, int) else 1
                except BaseException:
                    import traceback; traceback.print_exc()
                import atexit, threading
                threading._shutdown()  # what the interpreter does at its end: non-daemon threads joined, then the exit functions
                atexit._run_exitfuncs()
                sys.stdout.flush(); sys.stderr.flush()
            finally: os._exit(code)
        os.close(w); os.close(err)
        self.pid, self.returncode, self.stdout = pid, None, open(r, 'r')
    def _reap(self, flags=0):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, flags)
            if pid: self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode
    def poll(self): return self._reap(os.WNOHANG)
    def send_signal(self, sig): os.kill(self.pid, sig)
    def wait(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end: raise subprocess.TimeoutExpired(f'run {self.pid}', timeout)
            time.sleep(0.01)
        return self.returncode
    def communicate(self, timeout=None):
        rest = self.stdout.read()  # to the end of its output (the pipe closes when it exits)
        self.wait(timeout)
        return rest, None

def start(out, steps):
    if PROCS == 1 and not FRESH:
        out.mkdir(parents=True, exist_ok=True)
        return Forked(out, steps)
    flags = ['--background'] * BACKGROUND + ['--upload'] * UPLOAD + ['--slow-write', str(SLOW)] * bool(SLOW)
    if PROCS == 1: cmd = [sys.executable, __file__, '--child', str(out), '--steps', str(steps), '--loader', LOADER, *flags]
    else: cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', str(PROCS), __file__,
                 '--child', str(out), '--steps', str(steps), '--procs', str(PROCS), *flags]
    out.mkdir(parents=True, exist_ok=True)
    err = open(out/'stderr.txt', 'w')  # (a file: a pipe left unread while the trial waits would fill and stop the run)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)

def stderr(out): return (out/'stderr.txt').read_text()

def kill(p, out, rng):
    "SIGKILL the run: its one process, or (several) one of them drawn at random; then wait for the run to end"
    if PROCS == 1: p.send_signal(signal.SIGKILL)
    else:
        try: os.kill(int((out/f'pid_{rng.randrange(PROCS)}').read_text()), signal.SIGKILL)
        except (ProcessLookupError, FileNotFoundError, ValueError): pass
    try: p.communicate(timeout=300)
    except subprocess.TimeoutExpired:  # torchrun did not stop the other process: a hang
        os.killpg(p.pid, signal.SIGKILL); p.communicate()
        return 'hang'

def run_once(out, steps):
    "An uninterrupted run; its training time (from 'ready' to the end)"
    p = start(out, steps)
    assert p.stdout.readline().strip() == 'ready', (p.wait(), stderr(out))
    t0 = time.perf_counter()
    p.communicate()
    if p.returncode: raise SystemExit(f"the uninterrupted run failed:\n{stderr(out)[-3000:]}")
    return time.perf_counter() - t0

def progress(p, steps, rng):
    """Read the run's progress lines (`step N`, one per training batch) up to a point drawn over what is left of its training,
    then wait up to one checkpoint interval more at the pace this run goes now: the kill falls at a point of the run's own
    progress, however loaded the machine (an instant drawn from the reference run's time fell after the end of a run slowed
    by the load: 0 kills). Nothing is read from the checkpoints' folder, which `keep_last` empties as the run goes. Whether
    the run still runs (False: it ended first)"""
    share, extra = rng.uniform(0, 0.8), rng.random()  # (drawn first: the same draws whatever the pace)
    target, times = None, []
    for line in p.stdout:
        if not line.startswith('step '): continue
        step = int(line.split()[1]); times.append(time.perf_counter())
        if target is None: target = step + round(share * (steps - step))  # (the first line: where the (re)start resumed)
        if step >= target: break
    else: return False
    pace = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.  # seconds per step of this run, now
    time.sleep(extra * pace * int(EVERY.split()[0]))
    return p.poll() is None

def trial(out, steps, kills, rng):
    "Kill the run `kills` times at random points of its training (`progress`), restarting it each time; then let it end. Its record"
    rec = {'kills': 0, 'in_write': 0, 'in_upload': 0, 'restarts': 0, 'errors': []}
    while True:
        if UPLOAD and rec['restarts']: shutil.rmtree(out/'ckpt', ignore_errors=True)  # the restart is on a machine without the local checkpoints
        p = start(out, steps)
        line = p.stdout.readline().strip()
        if line != 'ready':  # it could not start: a checkpoint it could not resume, say
            p.communicate(); err = stderr(out)
            rec['errors'].append(err.strip().splitlines()[-1] if err.strip() else f'exit {p.returncode}')
            return rec
        if rec['kills'] < kills:
            if progress(p, steps, rng):
                if kill(p, out, rng) == 'hang': rec['errors'].append('a process hung after the other was killed')
                rec['kills'] += 1
                rec['in_write'] += any((out/'ckpt').glob('.checkpoint_*.tmp')) if (out/'ckpt').exists() else 0
                rec['in_upload'] += any((out/'remote').glob('.checkpoint_*.tmp')) if (out/'remote').exists() else 0
                rec['restarts'] += 1
                continue
            rec['missed'] = rec.get('missed', 0) + 1  # it ended before the point drawn
        p.communicate(); err = stderr(out)
        if p.returncode: rec['errors'].append(err.strip().splitlines()[-1] if err.strip() else f'exit {p.returncode}'); return rec
        return rec

def results(d:Path):
    "The records of the results file, without their times: (event, epoch or step, metrics, status, epochs or intervals), and how many runs"
    if not (d/'results.jsonl').exists(): return None
    lines = [json.loads(l) for l in (d/'results.jsonl').read_text().splitlines()]
    return len({l['run'] for l in lines}), [(l.get('event'), l.get('epoch', l.get('step')), json.dumps(l.get('metrics')), l.get('status'),
                                             l.get('epochs', l.get('intervals'))) for l in lines]  # (a run in steps writes `step`, `intervals`)

def scalars(d:Path):
    "TensorBoard's scalars in `d/tb`, as TensorBoard reads them: {tag: [(step, value)]} (None without tensorboard)"
    if not (d/'tb').exists(): return None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(d/'tb')); ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()['scalars']}

def compare(ref:Path, out:Path):
    "How the trial `out` ends against the uninterrupted `ref`: identical weights/optimizer/history, log lines lost and duplicated"
    import torch
    res = {'final': (out/'final.pt').exists()}
    if res['final']:
        a, b = (torch.load(d/'final.pt', weights_only=True) for d in (ref, out))
        same = lambda x, y: (torch.equal(x, y) if isinstance(x, torch.Tensor) else
                             (x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)) if isinstance(x, dict) else
                             (len(x) == len(y) and all(map(same, x, y))) if isinstance(x, (list, tuple)) else x == y)
        res |= {'weights': same(a['model'], b['model']), 'opt': same(a['opt'], b['opt']), 'history': same(a['history'], b['history'])}
    for name in ('log.csv', 'log.jsonl'):
        r = (ref/name).read_text().splitlines()
        o = (out/name).read_text().splitlines() if (out/name).exists() else []
        res[name] = {'lost': sum(max(0, r.count(l) - o.count(l)) for l in set(r)),
                     'dup': sum(max(0, o.count(l) - r.count(l)) for l in set(o)), 'same': r == o}
    res['results'] = results(ref) == results(out)
    res['tensorboard'] = scalars(ref) == scalars(out)
    from aisaac.callbacks.savers import checkpoints, checkpoint_problem
    res['checkpoints_unreadable'] = sum(checkpoint_problem(p) is not None for d in ('ckpt', 'remote') if (out/d).exists() for p in checkpoints(out/d))
    res['temps_left'] = sum(len(list(d.glob('.*.tmp'))) for d in (out, out/'ckpt', out/'remote', *out.glob('cache_*')))
    return res

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--child', type=Path, help=argparse.SUPPRESS)
    p.add_argument('--steps', type=int, default=STEPS)
    p.add_argument('--trials', type=int, default=50)
    p.add_argument('--kills', type=int, default=4, help='kills per trial')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--first', type=int, default=0, help='the first trial number (to replay one)')
    p.add_argument('--quick', action='store_true', help='3 trials of 2 kills (the tests); with --procs 2, 1 trial of 2 kills')
    p.add_argument('--procs', type=int, default=1, help='processes of the run (torchrun, gloo, DDP): 1 or 2')
    p.add_argument('--loader', choices=['tensor', 'stateful', 'shards'], default='tensor',
                   help="the training loader (one process): TensorLoader, torchdata's StatefulDataLoader with 2 workers, or ShardLoader")
    p.add_argument('--background', action='store_true', help='checkpoints written in the background: CheckpointCB(background=True)')
    p.add_argument('--upload', action='store_true', help="checkpoints uploaded to a file:// URL; each restart deletes the local ones and resumes from the URL")
    p.add_argument('--slow-write', type=float, default=0., help='seconds added to each checkpoint write and upload (with its temporary file there)')
    p.add_argument('--json', type=Path, help='also write the figures and every trial as JSON here')
    p.add_argument('--keep', action='store_true', help='keep the folders of the trials (printed)')
    p.add_argument('--fresh', action='store_true', help='each (re)start of a one-process run is a new Python (by default a fork of this one, its imports done once)')
    a = p.parse_args()
    global PROCS, LOADER, BACKGROUND, UPLOAD, SLOW, FRESH
    PROCS, LOADER, BACKGROUND, UPLOAD, SLOW, FRESH = a.procs, a.loader, a.background, a.upload, a.slow_write, a.fresh
    if a.child: return (child if a.procs == 1 else child_ddp)(a.child, a.steps)
    if a.procs == 1 and not a.fresh: preload()
    if a.quick: a.trials, a.kills = (3, 2) if a.procs == 1 else (1, 2)
    base = Path(tempfile.mkdtemp(prefix='aisaac-chaos-'))
    ref = base/'reference'
    train_secs = run_once(ref, a.steps)
    how = ' in the background' * a.background + ', uploaded (restarts from the URL)' * a.upload + f', each write and upload {a.slow_write:g} s slower' * bool(a.slow_write)
    print(f"# bench/chaos.py: {a.procs} process(es), {'' if a.procs > 1 else f'loader {a.loader}, '}{a.trials} trials of {a.kills} SIGKILLs, {a.steps} steps, checkpoints every {EVERY}{how} (keep 3), "
          f"seed {a.seed}; the uninterrupted run trains in {train_secs:.2f} s", flush=True)
    trials = []
    for i in range(a.first, a.first + a.trials):
        out = base/f'trial_{i:03d}'
        rec = trial(out, a.steps, a.kills, random.Random(a.seed * 1000 + i))
        rec |= compare(ref, out) | {'trial': i}
        trials.append(rec)
        ok = (rec.get('weights') and rec.get('opt') and rec.get('history') and rec['log.csv']['same'] and rec['log.jsonl']['same']
              and rec['results'] and rec['tensorboard'])
        print(f"#   trial {i}: {rec['kills']} kills ({rec['in_write']} in a checkpoint write, {rec['in_upload']} in an upload), "
              f"{'identical' if ok else 'DIFFERENT'}: weights {rec.get('weights')}, optimizer {rec.get('opt')}, history {rec.get('history')}, "
              f"csv lost/dup {rec['log.csv']['lost']}/{rec['log.csv']['dup']}, jsonl lost/dup {rec['log.jsonl']['lost']}/{rec['log.jsonl']['dup']}, "
              f"results file {rec['results']}, tensorboard {rec['tensorboard']}"
              + (f", errors {rec['errors']}" if rec['errors'] else ''), flush=True)
        if not a.keep and ok: shutil.rmtree(out)
    tot = lambda f: sum(f(r) for r in trials)
    figures = {'trials': len(trials), 'kills': tot(lambda r: r['kills']), 'kills_in_a_write': tot(lambda r: r['in_write']), 'kills_in_an_upload': tot(lambda r: r['in_upload']),
               'instants_after_the_end': tot(lambda r: r.get('missed', 0)),
               'identical': tot(lambda r: bool(r.get('weights') and r.get('opt') and r.get('history'))),
               'logs_identical': tot(lambda r: r['log.csv']['same'] and r['log.jsonl']['same'] and r['results'] and r['tensorboard']),
               'checkpoints_unreadable': tot(lambda r: r['checkpoints_unreadable']), 'temps_left': tot(lambda r: r['temps_left']),
               'csv_rows_lost': tot(lambda r: r['log.csv']['lost']), 'csv_rows_dup': tot(lambda r: r['log.csv']['dup']),
               'jsonl_rows_lost': tot(lambda r: r['log.jsonl']['lost']), 'jsonl_rows_dup': tot(lambda r: r['log.jsonl']['dup']),
               'errors': tot(lambda r: len(r['errors']))}
    print("\n| trials | kills | in a checkpoint write | in an upload | weights, optimizer, history identical | logs identical (CSV, JSON lines, results file, TensorBoard) | checkpoints unreadable | "
          "temporary files left | CSV rows lost / duplicated | JSON lines lost / duplicated | runs that failed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    f = figures
    print(f"| {f['trials']} | {f['kills']} | {f['kills_in_a_write']} | {f['kills_in_an_upload']} | {f['identical']} of {f['trials']} | {f['logs_identical']} of {f['trials']} | "
          f"{f['checkpoints_unreadable']} | {f['temps_left']} | {f['csv_rows_lost']} / {f['csv_rows_dup']} | "
          f"{f['jsonl_rows_lost']} / {f['jsonl_rows_dup']} | {f['errors']} |")
    if a.json: a.json.write_text(json.dumps({'figures': figures, 'trials': trials}, indent=1, default=str))
    if a.keep: print(f"# the trials' folders: {base}")
    else: shutil.rmtree(ref)
    return figures

if __name__ == '__main__':
    main()
