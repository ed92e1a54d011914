"Two features that are exact alone and must stay exact together (issue 46): each test names the figure seen before its fix."
import tempfile
from pathlib import Path
import pytest
import torch
from torch import nn

from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.gradients import MicroBatchCB

torch.manual_seed(0)
X, Y = torch.randn(32, 5), torch.randn(32, 2)

def _model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))

# ---- 1. MicroBatchCB and the trainer's clock

class Clocks(Callback):
    "The clock after each training batch, and the per-batch rows the loggers get"
    order = 200
    def before_fit(self, t): self.seen, self.logged = [], []
    def after_batch(self, t):
        if t.model.training: self.seen.append({k: v for k, v in t.clock.state_dict().items() if k != 'seconds'})
    def log(self, t, metrics, step, per):
        if per == 'batch': self.logged.append((sorted(metrics), step))

def _clock_fit(tmp_path, *cbs, name='a'):
    from aisaac.callbacks.savers import CheckpointCB, checkpoints
    from aisaac.callbacks.schedule import WarmupCosineSchedulerCB
    from aisaac.callbacks.monitors import LRMonitorCB, GradNormCB
    from aisaac.callbacks.metrics import MetricsCB
    clocks = Clocks()
    ckpt = CheckpointCB(tmp_path/name, every_n_epochs=None, every='16 samples', keep_last=None)
    t = Trainer(DataLoaders(TensorLoader(X, Y, bs=8), TensorLoader(X, Y, bs=8)), nn.MSELoss(), torch.optim.SGD, _model(),
                callbacks=[BasicTrainCB(), MetricsCB(), WarmupCosineSchedulerCB(warmup=2), LRMonitorCB(), GradNormCB(per_layer=False),
                           ckpt, clocks, *cbs])
    t.fit(1, lr=0.1, valid=False)
    return t, clocks, [p.name for p in checkpoints(tmp_path/name)]

def test_micro_batches_count_each_batch_once_on_the_clock(tmp_path):
    """4 steps of batch 8, each batch in 2 microbatches: the clock read micro_step 8 / samples 48 (each microbatch but the last
    counted again), where the same fit without MicroBatchCB reads 4 / 32; its `every='16 samples'` checkpoints, the loggers' batch
    rows and the schedule must be the fit's without microbatches"""
    ref, ref_clocks, ref_files = _clock_fit(tmp_path, name='ref')
    t, clocks, files = _clock_fit(tmp_path, MicroBatchCB(2), name='micro')
    assert (t.clock.micro_step, t.clock.samples, t.clock.step) == (ref.clock.micro_step, ref.clock.samples, ref.clock.step) == (4, 32, 4)
    assert clocks.seen == ref_clocks.seen
    assert files == ref_files and len(files) == 2
    assert clocks.logged == ref_clocks.logged
    assert [g['lr'] for g in t.opt.param_groups] == pytest.approx([g['lr'] for g in ref.opt.param_groups])
    names = ref.history.get_metric_names('batch')
    assert names and t.history.get_metric_names('batch') == names
    for k in names: assert t.history.get_metric_steps(k, per='batch') == ref.history.get_metric_steps(k, per='batch')
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(t.model.parameters(), ref.model.parameters()))

# ---- 5. tfm_batch on a dict batch (the text loaders' batches)

def _dict_batch():
    torch.manual_seed(0)
    return {'input_ids': torch.randint(0, 10, (4, 6)), 'attention_mask': torch.ones(4, 6, dtype=torch.long), 'labels': torch.randint(0, 10, (4, 6))}

def test_tfm_batch_transforms_the_inputs_and_targets_of_a_dict_batch():
    """`x, y, *rest = b` unpacked a dict's keys: tfm_batch(b, tfm_x=f) called f on the string 'input_ids' (TypeError: neg(): argument
    'input' (position 1) must be Tensor, not str), and tfm_batch(b, tfm_y=None) gave ('input_ids', 'attention_mask', 'labels'), the keys, as the batch. It must transform
    the inputs ('input_ids') and the targets ('labels', as BasicTrainCB finds them) and keep the rest"""
    from aisaac.callbacks.augment import tfm_batch
    b = _dict_batch()
    out = tfm_batch(b, tfm_x=torch.neg)
    assert isinstance(out, dict) and list(out) == list(b)
    assert torch.equal(out['input_ids'], -b['input_ids']) and out['labels'] is b['labels'] and out['attention_mask'] is b['attention_mask']
    out = tfm_batch(b, tfm_y=lambda y: y + 1)
    assert torch.equal(out['labels'], b['labels'] + 1) and out['input_ids'] is b['input_ids']
    out = tfm_batch(b, tfm_x=torch.neg, x_key='attention_mask', tfm_y=torch.neg, y_key='input_ids')
    assert torch.equal(out['attention_mask'], -b['attention_mask']) and torch.equal(out['input_ids'], -b['input_ids'])
    assert torch.equal(tfm_batch({'x': b['labels'], 'y': b['input_ids']}, tfm_x=torch.neg)['x'], -b['labels'])  # the one key not the target
    assert tfm_batch(b) == b and tfm_batch(b) is not b

def test_tfm_batch_refuses_a_dict_batch_it_cannot_read_naming_the_fix():
    "Keys it cannot tell the inputs or the targets among: refused, naming the keys and the argument to give (before: an obscure failure)"
    from aisaac.callbacks.augment import tfm_batch
    b = _dict_batch()
    with pytest.raises(ValueError, match=r"tfm_batch got a dict batch with keys \['pixels', 'mask', 'labels'\] and cannot tell its inputs: .*x_key="):
        tfm_batch({'pixels': b['input_ids'], 'mask': b['attention_mask'], 'labels': b['labels']}, tfm_x=torch.neg)
    with pytest.raises(ValueError, match=r"cannot tell its targets: .*first of \['label', 'labels', 'target', 'targets', 'y'\].*y_key="):
        tfm_batch({'input_ids': b['input_ids']}, tfm_y=torch.neg)
    with pytest.raises(KeyError, match=r"tfm_batch: the dict batch has no 'pixels' \(its keys: \['input_ids', 'attention_mask', 'labels'\]\)"):
        tfm_batch(b, tfm_x=torch.neg, x_key='pixels')
    with pytest.raises(TypeError, match=r"tfm_batch got a batch that is one tensor .*BatchTransformCB\(tfm\)"):
        tfm_batch(b['input_ids'], tfm_x=torch.neg)

def test_a_fit_on_dict_batches_with_a_batch_transform():
    "BatchTransformCB(partial(tfm_batch, tfm_x=...)) on a loader of dict batches: the model gets the transformed inputs (before: a TypeError)"
    from functools import partial
    from aisaac.callbacks.augment import BatchTransformCB, tfm_batch
    seen = []
    class Emb(nn.Module):
        def __init__(self):
            super().__init__(); self.emb = nn.Embedding(10, 10)
        def forward(self, x):
            seen.append(x.clone()); return self.emb(x).transpose(1, 2)
    b = _dict_batch()
    dl = [{'input_ids': b['input_ids'], 'labels': b['labels']}] * 2
    import types
    t = Trainer(types.SimpleNamespace(train=dl, valid=dl), nn.CrossEntropyLoss(), torch.optim.SGD, Emb(),
                callbacks=[BasicTrainCB(), BatchTransformCB(partial(tfm_batch, tfm_x=lambda x: 9 - x))])
    t.fit(1, lr=0.1)
    assert len(seen) == 4 and all(torch.equal(s, 9 - b['input_ids']) for s in seen)

# ---- 6. LSUVInitCB (and what matches modules or parameters by name) with CompileCB

def _conv_fit(*cbs, compiled=False):
    import types
    from aisaac.callbacks.compilation import CompileCB
    from aisaac.models import get_model_conv
    g = torch.Generator().manual_seed(0)
    b = [(torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(2)]
    torch.manual_seed(0)
    model = get_model_conv()
    t = Trainer(types.SimpleNamespace(train=b, valid=b[:1]), nn.CrossEntropyLoss(), torch.optim.SGD, model,
                callbacks=[BasicTrainCB(), *cbs, *([CompileCB(backend='eager')] if compiled else [])])
    t.fit(1, lr=0.1)
    return t, model

@pytest.mark.parametrize('modules', [None, 'pairs', 'list'])
def test_lsuv_init_cb_is_the_same_with_and_without_compile_cb(modules):
    """Under CompileCB the trainer's model is torch.compile's wrapper: LSUVInitCB named its layers '_orig_mod.0.0' ... (its stats keyed so,
    where without CompileCB they are '0.0' ...), and `modules=lambda m: [(l[0], l[1]) for l in m[:4]]` failed ('OptimizedModule' object is
    not subscriptable). It must initialise the same layers the same way, under the same names, and the fit's weights be the same"""
    from aisaac.callbacks.init import LSUVInitCB
    from aisaac.models import get_model_conv
    def cb():
        if modules == 'pairs': return LSUVInitCB(modules=lambda m: [(l[0], l[1]) for l in m[:4]])
        return LSUVInitCB(modules=None if modules is None else lambda m: [m[0][0], m[1][0]])
    ref, ref_model = _conv_fit(ref_cb := cb())
    t, model = _conv_fit(comp_cb := cb(), compiled=True)
    assert list(comp_cb.stats) == list(ref_cb.stats) and list(ref_cb.stats)[0] == '0.0'
    for k, v in ref_cb.stats.items(): assert comp_cb.stats[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    for (k, p), (k0, p0) in zip(model.state_dict().items(), ref_model.state_dict().items()):
        assert k == k0 and torch.allclose(p, p0, atol=1e-5), k

def test_per_layer_gradient_norms_have_the_same_names_with_compile_cb():
    "GradNormCB(per_layer=True) read the compiled wrapper's parameter names: 'grad_norm/_orig_mod.0.0.weight' where without CompileCB 'grad_norm/0.0.weight'"
    from aisaac.callbacks.monitors import GradNormCB
    ref, _ = _conv_fit(GradNormCB())
    t, _ = _conv_fit(GradNormCB(), compiled=True)
    names = ref.history.get_metric_names('batch')
    assert 'grad_norm/0.0.weight' in names and t.history.get_metric_names('batch') == names

# ---- GradNormCB and the step's gradients: accumulation, processes, float16

def test_gradient_norms_under_accumulation_are_the_steps_on_any_number_of_processes():
    """GradNormCB recorded after every backward: under GradAccumCB the window's partial sum, and for batches of tokens weighed for
    the window's tokens, so on two processes half of one process's (the invariance harness's seeded sample: RewardCB + GradNormCB
    + GradAccumCB(2), grad_norm 0.2752 on two processes where one process read 0.5505). It now records the step's gradients, once a step"""
    from aisaac.callbacks.monitors import GradNormCB
    from aisaac.callbacks.gradients import GradAccumCB
    from aisaac.callbacks.reward import reward_metrics
    from aisaac.callbacks.metrics import MetricsCB
    from aisaac.invariants import Case
    from aisaac.setups import tiny_gpt_trainer, tiny_reward_trainer
    from aisaac.processes import check_processes
    assert check_processes(Case(make=tiny_gpt_trainer, callbacks=lambda folder: [GradNormCB(), GradAccumCB(2)])) == []
    assert check_processes(Case(make=tiny_reward_trainer, callbacks=lambda folder: [
        MetricsCB(**reward_metrics(), show=False), GradNormCB(per_layer=False), GradAccumCB(2)])) == []
    big, acc = tiny_gpt_trainer([GradNormCB()], bs=8), tiny_gpt_trainer([GradNormCB(), GradAccumCB(2)], bs=4)
    for t in (big, acc): t.fit(1, lr=1e-2)
    steps = acc.history.get_metric_steps('grad_norm', per='batch')
    assert steps == list(range(1, 2 * big.clock.step, 2)) and acc.clock.step == big.clock.step  # one row a step, at its window's last batch
    for name in big.history.get_metric_names('batch'):
        if name.startswith('grad_norm'):
            assert acc.history.get_metric_values(name, per='batch') == pytest.approx(big.history.get_metric_values(name, per='batch'), rel=1e-4), name

def test_gradient_norms_under_float16_are_the_unscaled_ones():
    """Under MixedPrecisionCB(torch.float16) GradNormCB read the gradients the scaler had scaled: 65,536 times the norm (the scaler's
    first factor); it now reads them after MixedPrecisionCB unscales them, before GradClipCB clips them"""
    from aisaac.callbacks.monitors import GradNormCB
    from aisaac.callbacks.precision import MixedPrecisionCB
    from aisaac.callbacks.gradients import GradClipCB
    def norms(*cbs):
        t = Trainer(DataLoaders(TensorLoader(X, Y, bs=8), TensorLoader(X, Y, bs=8)), nn.MSELoss(), torch.optim.SGD, _model(),
                    callbacks=[BasicTrainCB(), GradNormCB(per_layer=False), *cbs])
        t.fit(1, lr=0.1, valid=False)
        return t.history.get_metric_values('grad_norm', per='batch')
    ref = norms()
    assert norms(MixedPrecisionCB(torch.float16)) == pytest.approx(ref, rel=2e-2)
    clipped = norms(GradClipCB(1e-3))
    assert clipped[0] == pytest.approx(ref[0], rel=1e-6) and min(clipped) > 1e-2  # the norms before clipping (to 1e-3)

def test_gradient_norms_and_learning_rates_share_the_steps_row_and_count_what_the_clip_clips():
    """Under GradAccumCB(2) LRMonitorCB numbered its rows by step (0, 1, 2...) and GradNormCB by the step's last batch (1, 3, 5...):
    a per-batch CSV paired step 1's rate with step 0's norm. GradNormCB summed the model's parameters only where GradClipCB clips
    every parameter the optimizer steps (a learnt loss temperature: 0.551078 against GradClipCB's 0.551567)"""
    import csv
    from aisaac.callbacks.monitors import GradNormCB, LRMonitorCB
    from aisaac.callbacks.gradients import GradAccumCB, GradClipCB
    from aisaac.callbacks.loggers import CSVLogger
    temp = nn.Parameter(torch.tensor(1.5))
    class Tempered(Callback):  # the loss divided by a learnt temperature, outside the model
        order = 1
        def after_loss(self, t): t.loss = t.loss / temp
    class Norms(Callback):
        order = 25  # after GradClipCB (20)
        def before_fit(self, t): self.clipped = []
        def before_step(self, t): self.clipped.append(float(t.GradClipCB.norm))
    t = Trainer(DataLoaders(TensorLoader(X, Y, bs=4), TensorLoader(X, Y, bs=8)), nn.MSELoss(), lambda ps, lr: torch.optim.SGD([*ps, temp], lr=lr),
                _model(), callbacks=[BasicTrainCB(), Tempered(), GradNormCB(), LRMonitorCB(), GradAccumCB(2), GradClipCB(10.), norms := Norms(),
                                     CSVLogger(Path(tempfile.mkdtemp())/'b.csv', per='batch')])
    t.fit(1, lr=0.1, valid=False)
    h = t.history
    assert h.get_metric_steps('lr', per='batch') == h.get_metric_steps('grad_norm', per='batch') == [1, 3, 5, 7]
    rows = list(csv.DictReader(open(t.CSVLogger.path)))
    assert all(bool(r['lr']) == bool(r['grad_norm']) for r in rows), rows  # a step's rate and norm in one row
    assert h.get_metric_values('grad_norm', per='batch') == pytest.approx(norms.clipped, rel=1e-6)
    assert 'grad_norm/opt.0' in h.get_metric_names('batch')

# ---- the speed and time-left monitors with resume and processes

def test_the_time_left_after_a_resume_counts_the_batches_trained_before_it(tmp_path):
    """RuntimeEstimatorCB planned the whole fit again after `resume_from`: a fit of 24 batches stopped after 12 and resumed planned 24
    and counted 12 done, so its last `time_remaining` was 12 batches' time (0.071 s) where the fit had none left"""
    from aisaac.core.callback import CancelFitException
    from aisaac.callbacks.monitors import RuntimeEstimatorCB
    from aisaac.callbacks.savers import CheckpointCB, last_checkpoint
    class Stop(Callback):
        order = 1000
        def checkpoint(self, t, at):
            if at == 'batch' and t.clock.micro_step == 12: raise CancelFitException()
    def make(*cbs):
        return Trainer(DataLoaders(TensorLoader(X, Y, bs=4), TensorLoader(X, Y, bs=8)), nn.MSELoss(), torch.optim.SGD, _model(),
                       callbacks=[BasicTrainCB(), *cbs])
    for i, fit in enumerate((dict(n_epochs=3), dict(steps=24))):
        d = tmp_path/str(i)
        make(RuntimeEstimatorCB(), CheckpointCB(d, every_n_batches=4, every_n_epochs=None), Stop()).fit(**fit, lr=0.1, valid=False)
        t = make(re := RuntimeEstimatorCB())
        t.fit(**fit, lr=0.1, valid=False, resume_from=last_checkpoint(d))
        assert (re.total, re.done, re.remaining) == (24, 24, 0), fit
        assert t.history.get_metric_values('time_remaining', per='batch')[-1] == 0  # (the history's rows: the checkpoint's 11, then 11 after the resume)

class _Tokens(Callback):
    "SpeedMonitorCB's count of the tokens trained on, and the tokens its `epoch_mfu` stands for (mfu x every device's peak / FLOPs per token x seconds)"
    order = 1000
    def after_fit(self, t):
        import torch.distributed as dist
        world, s, h = dist.get_world_size() if dist.is_initialized() else 1, t.SpeedMonitorCB, t.history
        self.state = {'tokens': s.tokens, 'mfu_tokens': [round(m * world * s.peak_flops / s.flops_per_token * secs) for m, secs in
                                                         zip(h.get_metric_values('epoch_mfu'), h.get_metric_values('train_time'))]}
    def state_dict(self): return getattr(self, 'state', {})

class _Dicts:
    "A loader's `(ids, targets)` batches as `{'input_ids', 'labels'}` dicts"
    def __init__(self, dl): self.dl = dl
    def __len__(self): return len(self.dl)
    def __iter__(self): return ({'input_ids': x, 'labels': y} for x, y in self.dl)
    def __getattr__(self, k): return getattr(self.dl, k)

def _gpt_dicts(callbacks=(), bs=8, world=None):
    from aisaac.setups import tiny_gpt_trainer
    t = tiny_gpt_trainer(callbacks, bs=bs, world=world)
    t.dls.train, t.dls.valid = _Dicts(t.dls.train), _Dicts(t.dls.valid)
    return t

@pytest.mark.parametrize('batches', ['tuples', 'dicts'])
def test_speed_counts_every_processs_tokens_and_mfu_every_devices_peak(batches):
    """On 2 processes SpeedMonitorCB counted (ids, targets) tuples' tokens of its own share only (192 of a pass's 384), and for dict
    batches (the clock's tokens, every process's) measured mfu against one device's peak (2x); now both count 384 against 2 peaks"""
    from aisaac.callbacks.monitors import SpeedMonitorCB
    from aisaac.invariants import Case
    from aisaac.setups import tiny_gpt_trainer
    from aisaac.processes import check_processes
    make = tiny_gpt_trainer if batches == 'tuples' else _gpt_dicts
    out = check_processes(Case(make=make, callbacks=lambda folder: [SpeedMonitorCB(peak_flops=1e12), _Tokens()]))
    assert not [l for l in out if '_Tokens' in l or 'raised' in l or 'not checked' in l], out  # (the speeds themselves differ: wall-clock)
    one = make([SpeedMonitorCB(peak_flops=1e12), tok := _Tokens()])
    one.fit(1, lr=1e-2)
    assert tok.state['tokens'] == len(one.dls.train) * 8 * 8 and tok.state['mfu_tokens'] == [tok.state['tokens']]  # 8 rows of 8 tokens a batch

# ---- SaveBestModelCB and an average: what the model holds after the fit predicts

@pytest.mark.parametrize('averaging', ['ema', 'swa'])
def test_after_the_best_average_is_loaded_back_predictions_are_the_models(tmp_path, averaging):
    """SaveBestModelCB + EMACB(decay=0.6): the model held the best average after the fit (validation loss 0.6436, as exported), but
    capture_preds and Interpretation, validation-only fits, swapped the callback's final average in: 0.8580 (SWACB: 0.6965 for 0.6666)"""
    import torch.nn.functional as F
    from aisaac.callbacks.metrics import MetricsCB
    from aisaac.callbacks.averaging import EMACB, SWACB
    from aisaac.callbacks.savers import SaveBestModelCB
    from aisaac.callbacks.interpret import Interpretation
    g = torch.Generator().manual_seed(0)
    x = torch.randn(141, 4, generator=g); y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    dls = DataLoaders(TensorLoader(x[:96], y[:96], bs=16, shuffle=True, seed=0), TensorLoader(x[96:], y[96:], bs=16))
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    avg = EMACB(decay=0.6) if averaging == 'ema' else SWACB(start=0.3)
    t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, m, callbacks=[BasicTrainCB(), MetricsCB(show=False), avg, SaveBestModelCB(tmp_path/'best.pt')])
    t.fit(8, lr=3.0)
    assert t.SaveBestModelCB.best < t.history.get_metric_values('valid_loss')[-1]  # the best epoch is not the last: the two averages differ
    t.model.eval()
    with torch.no_grad(): held = t.model(x[96:])
    assert F.cross_entropy(held, y[96:]).item() == pytest.approx(t.SaveBestModelCB.best, rel=1e-5)
    preds, targs = t.capture_preds()
    assert (preds - held).abs().max().item() < 1e-5
    assert Interpretation.from_trainer(t).losses.mean().item() == pytest.approx(t.SaveBestModelCB.best, rel=1e-5)

# ---- ActivationStatsCB with microbatches, an initialisation's passes and compilation

def _stats_fit(*cbs):
    "ActivationStatsCB on the ReLU of a seeded MLP, 3 training batches of 16: each entry's (mean, std, histogram)"
    from types import SimpleNamespace
    from fastcore.basics import risinstance
    from aisaac.callbacks.hooks import ActivationStatsCB
    g = torch.Generator().manual_seed(0); x = torch.randn(48, 8, generator=g); y = (x[:, 0] > 0).long()
    b = [(x[i:i+16], y[i:i+16]) for i in range(0, 48, 16)]
    torch.manual_seed(1)
    st = ActivationStatsCB(risinstance(nn.ReLU))
    Trainer(SimpleNamespace(train=b, valid=b[:2]), nn.CrossEntropyLoss(), torch.optim.SGD, nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)),
            callbacks=[BasicTrainCB(), *cbs, st]).fit(1, lr=0.1)
    return [torch.stack(v).float() for v in st[0].stats]

def test_activation_stats_are_one_entry_a_batch_under_microbatches():
    "MicroBatchCB(2): 6 entries for 3 batches, each a half batch's (means .2762, .2953... where the batches' are .2857, .2268, .2111)"
    from aisaac.callbacks.gradients import MicroBatchCB
    ref, micro = _stats_fit(), _stats_fit(MicroBatchCB(2))
    assert [len(v) for v in micro] == [3, 3, 3]
    for a, b in zip(ref, micro): assert torch.allclose(a, b, atol=1e-5), (a, b)

def test_activation_stats_leave_out_an_initialisations_passes():
    "LSUVInitCB's measuring passes (in before_fit, the model in training mode) were recorded as training batches: 7 entries for 3"
    from aisaac.callbacks.init import LSUVInitCB
    assert [len(v) for v in _stats_fit(LSUVInitCB())] == [3, 3, 3]

def test_activation_stats_under_compile_cb_are_the_eager_ones():
    "Any HooksCallback raised under CompileCB at the first batch (its hook read the compiled wrapper's `training`: 'already tracked for mutation')"
    from aisaac.callbacks.compilation import CompileCB
    for a, b in zip(_stats_fit(), _stats_fit(CompileCB(backend='eager'))): assert torch.allclose(a, b, atol=1e-5)

def test_a_plateau_schedule_watches_an_evaluation_set_at_the_epochs_it_is_evaluated():
    """PlateauSchedulerCB('far/valid_loss') with `Eval(dl, every=2)` raised at epoch 0 ('not recorded'), where the stoppers and
    SaveBestModelCB read such a set at the epochs it is evaluated; it now steps there, its patience counted in evaluations, as torch's"""
    import io, contextlib
    from aisaac.invariants import tiny_trainer, tiny_dls
    from aisaac.callbacks.metrics import MetricsCB
    from aisaac.callbacks.schedule import PlateauSchedulerCB
    from aisaac.evals import EvalSetsCB, Eval
    class LR(Callback):
        order = 200
        def checkpoint(self, t, at):
            if at == 'epoch': self.lr = getattr(self, 'lr', []) + [t.opt.param_groups[0]['lr']]
    t = tiny_trainer([MetricsCB(show=False), PlateauSchedulerCB(watch_metric='far/valid_loss', patience=0, factor=0.5, threshold=0.2),
                      EvalSetsCB(far=Eval(tiny_dls(8, seed=5).valid, every=2)), lr := LR()])
    with contextlib.redirect_stdout(io.StringIO()): t.fit(8, lr=1e-1)
    steps, values = t.history.get_metric_steps('far/valid_loss'), t.history.get_metric_values('far/valid_loss')
    assert steps == [1, 3, 5, 7]
    p = nn.Parameter(torch.zeros(1)); o = torch.optim.SGD([p], lr=1e-1)
    ref, s, cur = [], torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5, threshold=0.2), 1e-1
    for e in range(8):
        if e in steps: s.step(values[steps.index(e)]); cur = o.param_groups[0]['lr']
        ref.append(cur)
    assert lr.lr == pytest.approx(ref)

def test_the_items_of_largest_loss_are_the_same_after_a_resume_when_losses_tie():
    """ItemLossesCB + UnfreezeCB on the conv setup (the full invariance design): after a resume one of the items kept was 16 places
    off (top_idxs differ by 16): equal losses ranked by topk in the order the candidates came, which a checkpoint's join changes; the
    lower index now comes first among equal losses"""
    from torcheval.metrics import MulticlassAccuracy
    from aisaac.callbacks.metrics import MetricsCB
    from aisaac.callbacks.schedule import UnfreezeCB
    from aisaac.callbacks.interpret import ItemLossesCB
    from aisaac.invariants import Case, check_resume
    from aisaac.setups import tiny_conv_trainer
    assert check_resume(Case(make=tiny_conv_trainer, callbacks=lambda folder: [MetricsCB(acc=MulticlassAccuracy(num_classes=3), show=False),
                                                                               UnfreezeCB(), ItemLossesCB()])) == []

# ---- schedules with a cancelled fit and a rollback

class _Rates(Callback):
    "The first group's rate at each applied optimizer step"
    order = 1000
    def before_fit(self, t): self.lrs = []
    def after_step(self, t): self.lrs.append(t.opt.param_groups[0]['lr'])
    def state_dict(self): return {'lrs': list(self.lrs)}
    def load_state_dict(self, s): self.lrs = list(s['lrs'])

def test_a_fit_cancelled_after_a_step_leaves_the_next_fits_schedule_alone():
    """A fit cancelled in `after_batch` after its step (a miniai-style stop) left BatchSchedulerCB's note of the step, and the next fit's
    first batch stepped the schedule with no optimizer step: under GradAccumCB(2) its rates were 0.01, 0.01, 0.00775... for 0.005, 0.01, 0.01..."""
    import math
    from types import SimpleNamespace
    from aisaac.core.callback import CancelFitException
    from aisaac.callbacks.schedule import WarmupCosineSchedulerCB
    from aisaac.callbacks.gradients import GradAccumCB
    x = torch.randn(40, 2); y = x.sum(1, keepdim=True)
    class StopAt(Callback):
        def after_batch(self, t):
            if t.training and t.clock.step == 3: raise CancelFitException()
    stop = StopAt()
    t = Trainer(SimpleNamespace(train=[(x[i:i+8], y[i:i+8]) for i in range(0, 40, 8)], valid=[(x[:8], y[:8])]), nn.MSELoss(), torch.optim.Adam,
                nn.Linear(2, 1), callbacks=[BasicTrainCB(), stop, WarmupCosineSchedulerCB(warmup=2), GradAccumCB(2), rates := _Rates()])
    t.fit(2, lr=1e-2)
    t.remove_callbacks(stop)
    t.fit(2, lr=1e-2)  # 10 batches, 5 steps
    o = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-2)
    s = torch.optim.lr_scheduler.SequentialLR(o, [torch.optim.lr_scheduler.LinearLR(o, 0.5, 1., total_iters=1),
        torch.optim.lr_scheduler.LambdaLR(o, lambda k: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 3)))], milestones=[2])
    want = []
    for _ in range(5): want.append(o.param_groups[0]['lr']); o.step(); s.step()
    assert rates.lrs == pytest.approx(want)

def test_a_rollback_lowers_the_floor_of_a_warm_up_cosine_schedule():
    """LossSpikeCB's rollback halves every rate and the rates its scheduler computes from, but WarmupCosineSchedulerCB's `min_lr` stayed:
    after the rollback the rates fell to the old floor 0.005, not 0.0025 (0.01 at step 9 for 0.00813)"""
    from types import SimpleNamespace
    from aisaac.callbacks.schedule import WarmupCosineSchedulerCB
    from aisaac.callbacks.spikes import LossSpikeCB
    g = torch.Generator().manual_seed(0); w = torch.randn(4, 1, generator=g)
    xs = [torch.randn(8, 4, generator=g) for _ in range(24)]
    class Spike(Callback):
        order = -1
        def after_loss(self, t):
            if t.model.training and t.batch_num == 13: t.loss = t.loss * 1e4
    def run(*cbs):
        torch.manual_seed(0)
        t = Trainer(SimpleNamespace(train=[(x, x @ w) for x in xs], valid=[]), nn.MSELoss(), torch.optim.SGD, nn.Linear(4, 1),
                    callbacks=[BasicTrainCB(), WarmupCosineSchedulerCB(warmup=3, decay=12, min_lr=0.005), *cbs, _Rates()])
        t.fit(1, lr=0.05, valid=False)
        return t._Rates.lrs
    straight, rolled = run(), run(LossSpikeCB('rollback', warmup=3, check_every=4, snapshot_every=8), Spike())
    assert rolled[8:16] == pytest.approx([0.5 * v for v in straight[8:16]])

# ---- SaveBestModelCB's file and a resume

def test_a_fit_resumed_without_the_best_weights_file_warns_and_keeps_its_weights(tmp_path):
    """The checkpoint holds SaveBestModelCB's best score, not its file: a fit resumed with another `path` (another node) trained to its end
    and then raised FileNotFoundError in cleanup_fit; it now warns, naming the fix, and the model keeps the fit's last weights"""
    import io, contextlib
    from aisaac.invariants import tiny_trainer
    from aisaac.callbacks.metrics import MetricsCB
    from aisaac.callbacks.savers import CheckpointCB, SaveBestModelCB
    class Worse(Callback):  # the watched value best at epoch 1
        order = -5
        def checkpoint(self, t, at):
            if at == 'epoch': t.history.update_metric('vl', [0.9, 0.5, 0.7, 0.8, 0.9][t.epoch])
    mk = lambda best: tiny_trainer([MetricsCB(show=False), SaveBestModelCB(best, watch_metric='vl'), CheckpointCB(tmp_path/'ck', keep_last=None), Worse()])
    quiet = lambda: contextlib.redirect_stdout(io.StringIO())
    a = mk(tmp_path/'best.pt')
    with quiet(): a.fit(5, lr=1e-2)
    best = {k: v.clone() for k, v in a.model.state_dict().items()}
    ck = tmp_path/'ck'/'checkpoint_0003_000000.pt'
    same = mk(tmp_path/'best.pt')
    with quiet(): same.fit(5, resume_from=ck)
    assert all(torch.equal(v, best[k]) for k, v in same.model.state_dict().items())  # the run's own file: loaded
    b = mk(tmp_path/'node2'/'best.pt')
    with pytest.warns(UserWarning, match=r"is missing, so the model keeps the fit's last weights.*the same `path`"):
        with quiet(): b.fit(5, resume_from=ck)
    assert b.outcome == 'ok'

# ---- SampleCB with epochs, a resume, an average and a Hugging Face model

def _sample_fit(*cbs, every='1 epoch', **fit):
    import io, contextlib
    from aisaac.setups import tiny_gpt_trainer, CharTokenizer
    from aisaac.callbacks.samples import SampleCB
    sc = SampleCB('abc', CharTokenizer(), every=every, max_new_tokens=12, seed=3)
    t = tiny_gpt_trainer([*cbs, sc])
    with contextlib.redirect_stdout(io.StringIO()): t.fit(**({'n_epochs': 3} | fit), lr=0.1)
    return sc.samples

def test_samples_every_epoch_are_taken_at_the_epochs_end_and_survive_a_resume(tmp_path):
    """SampleCB(every='1 epoch') sampled after the next epoch's first batch (steps 7, 13 for 6, 12: the clock counts an epoch after its
    last batch), so a fit resumed from an epoch's checkpoint had lost that epoch's sample (13, 18 where the straight fit had 7, 13, 18)"""
    from aisaac.callbacks.savers import CheckpointCB, last_checkpoint
    straight = _sample_fit()
    assert [s for s, _ in straight] == [6, 12, 18]
    class Crash(Callback):
        def after_batch(self, t):
            if t.model.training and t.clock.step == 9: raise RuntimeError('crash')
    with pytest.raises(RuntimeError): _sample_fit(CheckpointCB(tmp_path/'ck'), Crash())
    assert _sample_fit(CheckpointCB(tmp_path/'ck'), resume_from=last_checkpoint(tmp_path/'ck')) == straight

def test_the_last_sample_is_of_the_raw_weights_with_an_average():
    """With EMACB the end-of-fit sample came from the average (swapped in for the last validation), every other sample from the raw
    weights: step 10's text depended on which path took it. Every sample is of the raw weights now, as without EMACB"""
    from aisaac.callbacks.averaging import EMACB
    assert _sample_fit(EMACB(decay=0.5), every='4 steps', steps=10, valid_every=5) == _sample_fit(every='4 steps', steps=10, valid_every=5)

def test_a_hugging_face_model_without_an_end_token_sees_its_whole_prompt():
    """A transformers model with no eos_token_id got pad_token_id=0, from which generate infers the attention mask: the prompt's token 0
    ('a') was masked out ('kpbbpnnffnnpienppnbj' where the whole prompt gives 'ppeponnejbnbocahahhg')"""
    pytest.importorskip('transformers')
    from transformers import GPT2Config, GPT2LMHeadModel
    from aisaac.setups import tiny_gpt_trainer, CharTokenizer
    from aisaac.callbacks.samples import SampleCB
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_layer=1, n_head=2, n_embd=16, eos_token_id=None, bos_token_id=None))
    t = tiny_gpt_trainer([]); t.model = hf
    tok = CharTokenizer()
    text = SampleCB('abc', tok, max_new_tokens=20, temperature=0.8, top_k=5, seed=3).sample(t)
    idx = torch.tensor([tok.encode('abc')])
    hf.eval()
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(3)
        want = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=20, do_sample=True, temperature=0.8, top_k=5, pad_token_id=0)
    assert text == tok.decode(want[0, 3:].tolist())

def test_on_policy_distillation_refuses_microbatches():
    """DistillCB(lmbda=1) + MicroBatchCB(2): each microbatch was replaced by the student's samples but weighed by the data batch's tokens
    (loss 0.002829 where the samples' mean is 0.005657: 32 sampled tokens over 64), and halves sampled to other lengths raised in
    MicroBatchCB.after_batch ('Sizes of tensors must match'); the combination is refused, naming GradAccumCB"""
    from aisaac.setups import tiny_gpt_trainer, tiny_gpt
    from aisaac.callbacks.distill import DistillCB
    from aisaac.callbacks.gradients import MicroBatchCB
    t = tiny_gpt_trainer([DistillCB(tiny_gpt(seed=1), 'reverse_kl', alpha=1., lmbda=1., max_new_tokens=2, chunk=8), MicroBatchCB(2)])
    with pytest.raises(ValueError, match=r"On-policy distillation.*MicroBatchCB splits.*GradAccumCB"): t.fit(1)
    tiny_gpt_trainer([DistillCB(tiny_gpt(seed=1), 'reverse_kl', alpha=1., chunk=8), MicroBatchCB(2)]).fit(1)  # off-policy: splits as ever
