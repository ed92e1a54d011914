"Monitors: their numbers against independent measurements (a stopwatch, a fake clock, clip_grad_norm_, torch's schedulers, psutil), history and loggers"
import csv, json, time
from types import SimpleNamespace
import pytest
import torch
from torch import nn
import aisaac.callbacks.monitors as monitors
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.models import get_model_conv
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.loggers import CSVLogger, JSONLinesLogger
from aisaac.callbacks.monitors import LRMonitorCB, SpeedMonitorCB, RuntimeEstimatorCB, GradNormCB, MemoryMonitorCB, memory_stats


def dls(sizes=(32, 32, 32, 16), n_valid=(32, 32), n_in=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda ss: [(torch.randn(n, n_in, generator=g), torch.randint(0, 2, (n,), generator=g)) for n in ss]
    return SimpleNamespace(train=mk(sizes), valid=mk(n_valid))


def trainer(*cbs, model=None, opt_func=torch.optim.SGD, **kw):
    torch.manual_seed(0)
    return Trainer(dls(**kw), nn.CrossEntropyLoss(), opt_func, model or nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
                   callbacks=[BasicTrainCB(), *cbs])


class Logs(Callback):
    def __init__(self): self.logs = []
    def log(self, trainer, metrics, step, per): self.logs.append((per, step, dict(metrics)))


class FakeClock:
    "A clock that only moves when told"
    def __init__(self): self.now = 100.
    def __call__(self): return self.now


class Ticking(nn.Module):
    "A linear model whose forward pass moves `clock` on by `secs` (training) or `valid_secs` (evaluation)"
    def __init__(self, clock, secs, valid_secs=None):
        super().__init__()
        self.lin, self.clock, self.secs, self.valid_secs = nn.Linear(4, 2), clock, secs, valid_secs or secs
    def forward(self, x):
        self.clock.now += self.secs if self.training else self.valid_secs
        return self.lin(x)


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(monitors, 'time', SimpleNamespace(perf_counter=c))
    return c


# Speed ----------------------------------------------------------------------------------------------------------------
class Sleepy(nn.Module):
    def __init__(self): super().__init__(); self.lin = nn.Linear(4, 2)
    def forward(self, x): time.sleep(0.005); return self.lin(x)


class Stopwatch(Callback):
    order = -1
    def before_fit(self, trainer): self.secs = []
    def before_train(self, trainer): self.start = time.perf_counter()
    def after_train(self, trainer): self.secs.append(time.perf_counter() - self.start)


def test_speed_matches_batch_size_times_batches_over_the_measured_time():
    watch = Stopwatch()
    t = trainer(SpeedMonitorCB(window_size=8), watch, model=Sleepy(), sizes=(32,) * 7 + (16,))
    t.fit(2)
    samples, batches = 32 * 7 + 16, 8
    for epoch, secs in enumerate(watch.secs):
        assert t.history.get_metric_values('epoch_samples_per_sec')[epoch] == pytest.approx(samples / secs, rel=0.1)
        assert t.history.get_metric_values('epoch_batches_per_sec')[epoch] == pytest.approx(batches / secs, rel=0.1)
    # the window of 8 batches is the whole pass: the last batch's reading covers the same time
    last = t.history.get_metric_values('samples_per_sec', per='batch')[-1]
    assert last == pytest.approx(samples / watch.secs[-1], rel=0.1)


def test_speed_window_on_a_fake_clock_counts_training_batches_only(clock):
    logs = Logs()
    t = trainer(SpeedMonitorCB(window_size=2), logs, model=Ticking(clock, 0.5, valid_secs=7.), sizes=(10, 10, 10, 4))
    t.fit(2)
    h = t.history
    # batches of 0.5 s; the window (2 batches) runs on across epochs, the validation passes' 14 s are not counted
    assert h.get_metric_values('samples_per_sec', per='batch') == [20., 20., 14., 14., 20., 20., 14.]
    assert h.get_metric_values('batches_per_sec', per='batch') == [2.] * 7
    assert h.get_metric_steps('samples_per_sec', per='batch') == [1, 2, 3, 4, 5, 6, 7]
    assert h.get_metric_values('epoch_samples_per_sec') == [34 / 2.] * 2
    assert h.get_metric_values('train_time') == [2., 2.]
    assert ('batch', 1, {'samples_per_sec': 20., 'batches_per_sec': 2.}) in logs.logs
    with pytest.raises(ValueError, match='at least 1'): SpeedMonitorCB(window_size=0)


# Time left -----------------------------------------------------------------------------------------------------------
def test_runtime_estimate_on_a_fake_clock_is_the_time_that_was_left(clock):
    est = RuntimeEstimatorCB(skip_batches=1)
    class Truth(Callback):
        "After each training batch, note the clock; after the fit, the true time left at each of those moments"
        order = 1
        def before_fit(self, trainer): self.at = []
        def after_batch(self, trainer):
            if trainer.model.training: self.at.append(clock.now)
    truth = Truth()
    t = trainer(est, truth, model=Ticking(clock, 0.1, valid_secs=0.3))  # 4 training batches of 0.1 s, 2 validation batches of 0.3 s
    t.fit(3)
    true_left = [clock.now - a for a in truth.at]
    estimates = t.history.get_metric_values('time_remaining', per='batch')
    assert t.history.get_metric_steps('time_remaining', per='batch') == list(range(1, 12))
    # in the first epoch no validation pass has been timed yet: the estimate is short by the validation time to come
    assert estimates[:3] == pytest.approx([left - 3 * 0.6 for left in true_left[1:4]])
    assert estimates[3:] == pytest.approx(true_left[4:])  # from then on, exact
    assert est.remaining == pytest.approx(0.6)  # after the last training batch, the last validation pass is left


def test_runtime_estimate_counts_every_validation_pass_of_an_epoch(clock):
    "The validation set (2 batches of 0.3 s) and an evaluation set (1 batch): after the last training batch 0.9 s of validation are left (before: 0.3, the last pass's alone)"
    from aisaac.evals import EvalSetsCB
    est = RuntimeEstimatorCB(skip_batches=1)
    from aisaac.callbacks.metrics import MetricsCB
    t = trainer(est, MetricsCB(show=False), EvalSetsCB(other=dls(n_valid=(32,), seed=1).valid), model=Ticking(clock, 0.1, valid_secs=0.3))
    t.fit(3)
    assert est.remaining == pytest.approx(0.9)


def test_runtime_estimator_needs_a_loader_length():
    t = trainer(RuntimeEstimatorCB())
    t.dls.train = iter(t.dls.train)
    with pytest.raises(TypeError, match='needs the length of the training loader'): t.fit(1)


# Gradient norms -------------------------------------------------------------------------------------------------------
class Clip(Callback):
    "After GradNormCB, what torch computes: clip_grad_norm_'s total (an infinite threshold changes nothing) and each gradient's norm"
    order = 1
    def before_fit(self, trainer): self.totals, self.each = [], []
    def after_backward(self, trainer):
        self.totals.append(torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), float('inf')).item())
        self.each.append({n: p.grad.norm().item() for n, p in trainer.model.named_parameters()})


def image_dls():
    g = torch.Generator().manual_seed(0)
    mk = lambda k: [(torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(k)]
    return SimpleNamespace(train=mk(3), valid=mk(1))


def test_grad_norm_equals_clip_grad_norm_total_and_each_gradients_norm():
    torch.manual_seed(0)
    clip, logs = Clip(), Logs()
    t = Trainer(image_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, get_model_conv(), callbacks=[BasicTrainCB(), GradNormCB(), clip, logs])
    t.fit(2, lr=0.1)
    h = t.history
    assert h.get_metric_values('grad_norm', per='batch') == pytest.approx(clip.totals, rel=1e-5)
    for name in clip.each[0]:
        assert h.get_metric_values(f'grad_norm/{name}', per='batch') == pytest.approx([e[name] for e in clip.each], rel=1e-5)
    grad_logs = [(step, m) for per, step, m in logs.logs if 'grad_norm' in m]
    assert [s for s, _ in grad_logs] == list(range(6))
    assert [m['grad_norm'] for _, m in grad_logs] == pytest.approx(clip.totals, rel=1e-5)
    assert len(grad_logs[0][1]) == 1 + len(list(t.model.parameters()))


def test_grad_norm_reads_nothing_on_the_host_per_batch(monkeypatch):
    class Strict(GradNormCB):
        def before_step(self, trainer):
            def forbidden(*a, **k): raise AssertionError('host read in before_step')
            with monkeypatch.context() as m:
                for name in ('item', 'tolist', 'cpu', 'numpy', '__float__'): m.setattr(torch.Tensor, name, forbidden)
                super().before_step(trainer)
    t = trainer(Strict(per_layer=False), logs := Logs())
    t.fit(1)
    assert len(t.history.get_metric_values('grad_norm', per='batch')) == 4
    assert [sorted(m) for per, _, m in logs.logs if per == 'batch'] == [['grad_norm']] * 4


# Learning rate -------------------------------------------------------------------------------------------------------
def test_lr_monitor_records_what_the_scheduler_sets_for_each_group_and_momentum():
    class Sched(Callback):
        def before_fit(self, trainer):
            self.s = torch.optim.lr_scheduler.OneCycleLR(trainer.opt, [0.1, 0.01], total_steps=8)
            self.lrs = []
        def before_step(self, trainer): self.lrs.append([g['lr'] for g in trainer.opt.param_groups])
        def after_batch(self, trainer):
            if trainer.model.training: self.s.step()
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = lambda params, lr: torch.optim.SGD([{'params': model[0].parameters()}, {'params': model[2].parameters()}], lr=lr, momentum=0.9)
    lrmon, sched = LRMonitorCB(), Sched()
    t = trainer(lrmon, sched, model=model, opt_func=opt)
    t.fit(2)
    h = t.history
    assert h.get_metric_values('lr_0', per='batch') == [l[0] for l in sched.lrs]
    assert h.get_metric_values('lr_1', per='batch') == [l[1] for l in sched.lrs]
    assert max(h.get_metric_values("lr_1", per="batch")) == pytest.approx(0.01, rel=0.05)
    mom = h.get_metric_values('momentum_0', per='batch')
    assert min(mom) == pytest.approx(0.85, rel=0.01) and mom[0] == pytest.approx(0.95)  # OneCycleLR cycles SGD's momentum between 0.95 and 0.85
    lrmon.plot()
    import matplotlib.pyplot as plt
    fig = plt.gcf()
    assert [ax.get_title() for ax in fig.axes] == ['Learning rate', 'Momentum']
    assert [ax.get_xlabel() for ax in fig.axes] == ['optimizer step'] * 2
    assert [len(ax.lines) for ax in fig.axes] == [2, 2]
    plt.close(fig)


def test_lr_monitor_adam_beta1_and_the_file_loggers(tmp_path):
    t = trainer(LRMonitorCB(), CSVLogger(tmp_path/'batches.csv', per='batch'), JSONLinesLogger(tmp_path/'log.jsonl'), opt_func=torch.optim.Adam)
    t.fit(1, lr=0.003)
    with open(tmp_path/'batches.csv') as f: rows = list(csv.DictReader(f))
    assert [(r['batch'], float(r['lr']), float(r['beta1'])) for r in rows] == [(str(i), 0.003, 0.9) for i in range(4)]
    lines = [json.loads(l) for l in (tmp_path/'log.jsonl').read_text().splitlines()]
    assert [l['lr'] for l in lines if 'lr' in l] == [0.003] * 4


# Memory ---------------------------------------------------------------------------------------------------------------
def test_memory_monitor_records_the_resident_set_size():
    psutil = pytest.importorskip('psutil')
    t = trainer(MemoryMonitorCB(every_n_batches=2), logs := Logs())
    t.fit(2)
    rss = t.history.get_metric_values('rss_mib')
    assert len(rss) == 2 and rss[-1] == pytest.approx(psutil.Process().memory_info().rss / 2**20, rel=0.2)
    assert t.history.get_metric_steps('rss_mib', per='batch') == [0, 2, 4, 6]
    assert [per for per, _, m in logs.logs if 'rss_mib' in m] == ['batch', 'batch', 'epoch'] * 2
    if not torch.cuda.is_available(): assert set(memory_stats()) == {'rss_mib'}


def test_memory_without_psutil_reads_proc(monkeypatch):
    import builtins, os
    if not os.path.exists('/proc/self/statm'): pytest.skip('no /proc')
    real_import = builtins.__import__
    def no_psutil(name, *a, **k):
        if name == 'psutil': raise ImportError(name)
        return real_import(name, *a, **k)
    with_psutil = monitors._rss()
    monkeypatch.setattr(builtins, '__import__', no_psutil)
    assert monitors._rss() == pytest.approx(with_psutil, rel=0.2)


@pytest.mark.cuda
def test_memory_monitor_on_cuda():
    from aisaac.callbacks.train import DeviceCB
    t = trainer(MemoryMonitorCB(), DeviceCB('cuda'))
    t.fit(1)
    h = t.history
    assert h.get_latest_metric('cuda_allocated_mib') > 0
    assert h.get_latest_metric('cuda_reserved_mib') >= h.get_latest_metric('cuda_allocated_mib')
    assert h.get_latest_metric('cuda_peak_mib') >= h.get_latest_metric('cuda_allocated_mib')


def test_per_epoch_values_take_the_runs_epoch_as_metricscb_does():
    from aisaac.callbacks.metrics import MetricsCB
    t = trainer(MetricsCB(), MemoryMonitorCB())
    t.fit(2)
    t.fit(1, callbacks=[SpeedMonitorCB()])  # a monitor for one later fit
    t.fit(1, valid=False)
    h = t.history
    assert h.get_metric_steps('train_loss') == [0, 1, 2, 3]
    assert h.get_metric_steps('rss_mib') == [0, 1, 2, 3]
    assert h.get_metric_steps('epoch_samples_per_sec') == [2]


def test_lr_monitor_shows_each_layer_group_by_name():
    "A fit at `lr=slice(lo, hi)` with AdamW: one series per layer group, named after it (a group's half without weight decay not twice)"
    from aisaac.callbacks.schedule import OneCycleSchedulerCB
    t = trainer(lrmon := LRMonitorCB(), OneCycleSchedulerCB(), opt_func=torch.optim.AdamW)
    t.fit(2, lr=slice(1e-3, 1e-2))
    assert [(g['name'], g.get('no_decay', False)) for g in t.opt.param_groups] == [('body', False), ('body', True), ('head', False), ('head', True)]
    assert sorted(lrmon.recs) == ['beta1_body', 'beta1_head', 'lr_body', 'lr_head']
    body, head = t.history.get_metric_values('lr_body', per='batch'), t.history.get_metric_values('lr_head', per='batch')
    assert len(body) == 8 and body == pytest.approx([h / 10 for h in head]) and max(head) == pytest.approx(1e-2, rel=0.05)
    t.fit(1, lr=1e-2)  # one rate, AdamW: two groups (with and without decay), one name: `lr`, as before
    assert sorted(lrmon.recs) == ['beta1', 'lr'] and len(t.opt.param_groups) == 2


# MFU ------------------------------------------------------------------------------------------------------------------
def _lm_trainer(cb, clock, model=None, T=16, V=64):
    "A GPT on batches of (ids, next ids) tuples, as nanoGPT's get_batch gives them, each training forward taking 0.5 s on the fake clock"
    from aisaac.models import GPT, lm_loss
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, V, (4, T + 1), generator=g) for _ in range(4)]
    torch.manual_seed(0)
    model = model or GPT(V, n_layer=2, n_head=2, d_model=16, block_size=T)
    def tick(m, args):
        if m.training: clock.now += 0.5
    model.register_forward_pre_hook(tick)
    return Trainer(SimpleNamespace(train=[(b[:, :-1], b[:, 1:]) for b in ids], valid=[(ids[0][:, :-1], ids[0][:, 1:])]), lm_loss,
                   torch.optim.SGD, model, callbacks=[BasicTrainCB(), cb]), model

def test_mfu_of_aisaacs_gpt_is_palms_formula_over_the_given_peak(clock):
    "GPT: 6N + 12 L H Q T FLOPs a token (N without the position embedding), 64 tokens a batch every 0.5 s: mfu = 128 tokens/s x that / peak"
    t, gpt = _lm_trainer(SpeedMonitorCB(window_size=2, peak_flops=1e9), clock)
    t.fit(1, lr=0.1)
    N = sum(p.numel() for p in gpt.parameters()) - gpt.pos_emb.weight.numel()
    fpt = 6 * N + 12 * 2 * 2 * 8 * 16  # L=2, H=2, Q=16/2, T=16
    assert t.SpeedMonitorCB.flops_per_token == fpt
    assert t.history.get_metric_values('tokens_per_sec', per='batch') == [128.] * 3
    assert t.history.get_metric_values('mfu', per='batch') == [pytest.approx(128 * fpt / 1e9)] * 3
    assert t.history.get_metric_values('epoch_mfu') == [pytest.approx(128 * fpt / 1e9)]

def test_mfu_of_a_model_in_nanogpts_interface_is_its_estimate_mfu(clock):
    "A model with nanoGPT's config and get_num_params: the FLOPs its estimate_mfu counts (6N + 12 L H Q T, T its block_size)"
    class Cfg: n_layer, n_head, n_embd, block_size = 2, 2, 16, 16
    class Nano(nn.Module):
        def __init__(self):
            super().__init__(); self.config = Cfg(); self.wte, self.wpe, self.lin = nn.Embedding(64, 16), nn.Embedding(16, 16), nn.Linear(16, 64)
        def get_num_params(self, non_embedding=True): return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        def forward(self, x): return self.lin(self.wte(x) + self.wpe(torch.arange(x.shape[1])))
    t, nano = _lm_trainer(SpeedMonitorCB(window_size=2, peak_flops=312e12), clock, model=Nano())
    t.fit(1, lr=0.1)
    fpt = 6 * nano.get_num_params() + 12 * 2 * 2 * 8 * 16
    assert t.SpeedMonitorCB.flops_per_token == fpt
    assert t.history.get_latest_metric('mfu', 'batch') == pytest.approx(128 * fpt / 312e12)  # nanoGPT's estimate_mfu, against an A100

def test_mfu_takes_given_flops_a_number_or_a_function(clock):
    t, _ = _lm_trainer(SpeedMonitorCB(window_size=2, flops_per_token=1000, peak_flops=1e6), clock)
    t.fit(1, lr=0.1)
    assert t.history.get_latest_metric('mfu', 'batch') == pytest.approx(128 * 1000 / 1e6)
    t, _ = _lm_trainer(SpeedMonitorCB(window_size=2, flops_per_token=lambda m: 2000, peak_flops=1e6), clock)
    t.fit(1, lr=0.1)
    assert t.history.get_latest_metric('mfu', 'batch') == pytest.approx(128 * 2000 / 1e6)

def test_no_mfu_on_the_cpu_without_a_peak(clock):
    t, _ = _lm_trainer(SpeedMonitorCB(window_size=2), clock)
    t.fit(1, lr=0.1)
    assert 'epoch_mfu' not in t.history.metric_names and t.history.get_metric_values('tokens_per_sec', per='batch') == [128.] * 3
    assert t.SpeedMonitorCB.flops_per_token and t.SpeedMonitorCB.peak_flops is None

def test_no_mfu_for_a_model_of_unknown_flops():
    t = trainer(SpeedMonitorCB(window_size=2, peak_flops=1e9))  # an MLP: no FLOPs per token known, none given
    t.fit(1)
    assert 'epoch_mfu' not in t.history.metric_names and t.SpeedMonitorCB.flops_per_token is None
    with pytest.raises(ValueError, match='peak_flops'): SpeedMonitorCB(peak_flops=-1)
    with pytest.raises(ValueError, match='flops_per_token'): SpeedMonitorCB(flops_per_token='6N')

def test_the_peak_of_known_gpus():
    assert monitors.gpu_peak_flops('NVIDIA A100-SXM4-80GB') == 312e12 and monitors.gpu_peak_flops('NVIDIA H100 80GB HBM3') == 989e12
    assert monitors.gpu_peak_flops('NVIDIA H100 PCIe') == 756e12 and monitors.gpu_peak_flops('NVIDIA H200') == 989e12
    assert monitors.gpu_peak_flops('NVIDIA L4') == 121e12 and monitors.gpu_peak_flops('NVIDIA L40S') == 362e12
    assert monitors.gpu_peak_flops('NVIDIA A10') == 125e12 and monitors.gpu_peak_flops('NVIDIA A10G') is None
    assert monitors.gpu_peak_flops('Some Future GPU') is None

def test_a_checkpoint_inside_an_epoch_keeps_the_gradient_norms_not_yet_sent_to_the_loggers():
    """Found by the invariance harness (issue 51: JSONLinesLogger + GradNormCB under `resume`, stopped after batch 2 of epoch 1): GradNormCB
    sends a pass's norms to the loggers at the pass's end, and those of the batches before a checkpoint inside the epoch were in no
    state, so the resumed fit's JSON-lines file lacked the lines of steps 6-8 (11 lines instead of 14, 2,239 bytes instead of 2,914)"""
    from aisaac.invariants import Case, check_resume
    from aisaac.callbacks.metrics import MetricsCB
    from aisaac.callbacks.loggers import JSONLinesLogger
    case = Case(callbacks=lambda folder: [MetricsCB(show=False), GradNormCB(), JSONLinesLogger(folder/'log.jsonl')])
    assert check_resume(case, points=[('epochs', 1, 2)]) == []

def test_a_resumed_json_lines_file_keeps_the_uninterrupted_fits_order_of_gradient_norms_and_rates():
    """Found by the invariance harness's CI sample after the junction merge (JSONLinesLogger + LRMonitorCB + GradNormCB under `resume`):
    GradNormCB sent the norms it held to the loggers before a checkpoint inside a pass, so the resumed file had them before LRMonitorCB's
    lines of the next steps, where the uninterrupted fit writes them at the pass's end (line 17 of 26: step 9's rate against step 6's norms)"""
    from aisaac.invariants import Case, check_resume
    from aisaac.callbacks.metrics import MetricsCB
    from aisaac.callbacks.loggers import JSONLinesLogger
    case = Case(callbacks=lambda folder: [MetricsCB(show=False), JSONLinesLogger(folder/'log.jsonl'), LRMonitorCB(), GradNormCB()])
    assert check_resume(case, points=[('epochs', 1, 2), ('steps', 0, 3)]) == []
