"""Parameter groups (`aisaac.params`): AdamW leaves biases, norms and embeddings out of its weight decay; `fit(lr=slice(lo, hi))` gives
each layer group its rate, kept through a one-cycle schedule; freezing leaves the frozen weights bit-identical and the batch norms
training; `fine_tune` runs fastai's two fits; a run with groups and a freeze resumes exactly, and a checkpoint of other groups is
refused; miniai's and AIsaac's `opt_func`s work as before; a model without parameters, LoRA and DistributedDataParallel are refused
with the reason; under FSDPCB, `fine_tune` takes the steps of one process (tests/params_run.py, 2 processes)."""
import math, sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace
import pytest, torch
from torch import nn

from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.schedule import OneCycleSchedulerCB, UnfreezeCB
from aisaac.models import get_model_gpt, lm_loss
from aisaac.persist import CheckpointError
import aisaac.callbacks.lr_finder  # (adds `Trainer.lr_find`)

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import torchrun_cases, tiny

def gpt_trainer(*cbs, opt_func=torch.optim.AdamW, seed=0):
    "A tiny GPT (4 layer groups: embed, block0, block1, final) on 4 batches of token sequences"
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, 32, (16, 9), generator=g)
    dls = SimpleNamespace(train=[(toks[i:i+4, :-1], toks[i:i+4, 1:]) for i in range(0, 16, 4)], valid=[(toks[:4, :-1], toks[:4, 1:])])
    torch.manual_seed(seed)
    return Trainer(dls, lm_loss, opt_func, get_model_gpt(32, n_layer=2, d_model=16, block_size=8), callbacks=[BasicTrainCB(), *cbs])

def weights(t): return [p.detach().clone() for p in t.model.parameters()]

class GroupLRs(Callback):
    "Each parameter group's rate at each optimizer step"
    def before_fit(self, t): self.lrs = []
    def before_step(self, t): self.lrs.append([g['lr'] for g in t.opt.param_groups])

def test_adamw_leaves_biases_norms_and_embeddings_out_of_weight_decay():
    t = gpt_trainer()
    groups = t.param_groups()
    names = [n for n, _ in t.model.named_parameters()]
    kept = [n for n, p in t.model.named_parameters() if p.ndim < 2 or n in ('tok_emb.weight', 'pos_emb.weight')]
    assert [g['name'] for g in groups] == ['all', 'all (no decay)'] and [g['weight_decay'] for g in groups] == [0.01, 0.]
    assert groups[1]['params'] == kept and groups[0]['params'] == [n for n in names if n not in kept]
    assert 'blocks.0.ln1.weight' in kept and 'blocks.0.attn.qkv.bias' in kept and 'blocks.0.attn.qkv.weight' not in kept
    t.fit(1, lr=1e-2)
    assert [(g['name'], g['weight_decay'], len(g['params'])) for g in t.opt.param_groups] == [('all', 0.01, 8), ('all', 0., 20)]
    t.no_decay = False  # as before: one group, every parameter decayed
    assert [(g['name'], g['weight_decay']) for g in t.param_groups(lr=1e-2)] == [('all', 0.01)]
    t = gpt_trainer(opt_func=torch.optim.Adam)  # no weight decay: the optimizer `opt_func` made, one group
    t.fit(1, lr=1e-2)
    assert len(t.opt.param_groups) == 1 and 'name' not in t.opt.param_groups[0]

def test_a_slice_gives_each_layer_group_its_rate_through_a_one_cycle_schedule():
    rec = GroupLRs()
    t = gpt_trainer(OneCycleSchedulerCB(), rec)
    t.fit(2, lr=slice(1e-4, 1e-2))
    want = [1e-4 * 100 ** (i / 3) for i in range(4)]  # embed, block0, block1, final: geometric from lo to hi
    names = [g['name'] for g in t.opt.param_groups]
    assert names == ['embed', 'block0', 'block0', 'block1', 'block1', 'final'] and t.lrs == pytest.approx(want) and t.lr == 1e-2
    per_group = [want[['embed', 'block0', 'block1', 'final'].index(n)] for n in names]
    assert [g['max_lr'] for g in t.opt.param_groups] == pytest.approx(per_group)
    assert len(rec.lrs) == 8 and all(lrs == pytest.approx([r * step[-1] / 1e-2 for r in per_group]) for step in rec.lrs for lrs in [step])
    assert max(step[-1] for step in rec.lrs) == pytest.approx(1e-2, rel=0.05)

def cnn_trainer(**kw):
    torch.manual_seed(0)
    x, y = torch.randn(64, 3, 8, 8), torch.randint(0, 4, (64,))
    dls = SimpleNamespace(train=[(x[i:i+16], y[i:i+16]) for i in range(0, 64, 16)], valid=[(x[:16], y[:16])])
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                          nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    return Trainer(dls, nn.CrossEntropyLoss(), torch.optim.AdamW, model, callbacks=[BasicTrainCB()])

def test_freezing_leaves_the_frozen_weights_bit_identical_and_the_batch_norms_training():
    t = cnn_trainer()
    m = t.model
    for p in m.parameters(): p.grad = torch.ones_like(p)  # a gradient left over: a frozen weight's is dropped
    t.freeze()  # the body (convolutions and batch norms) frozen, the head (the linear layer) trains; AdamW's decay would move a stepped weight
    assert [n for n, p in m.named_parameters() if p.requires_grad] == ['1.weight', '1.bias', '4.weight', '4.bias', '8.weight', '8.bias']
    assert m[0].weight.grad is None and m[1].weight.grad is not None
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    t.fit(2, lr=1e-2)
    changed = {n for n, p in m.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {'1.weight', '1.bias', '4.weight', '4.bias', '8.weight', '8.bias'}, changed
    t.train_bn = False
    t.freeze()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    t.fit(1, lr=1e-2)
    assert {n for n, p in m.named_parameters() if not torch.equal(p, before[n])} == {'8.weight', '8.bias'}
    t.unfreeze()
    assert all(p.requires_grad for p in m.parameters())
    with pytest.raises(ValueError, match=r"`freeze_to\(2\)` would freeze every one of the model's 2 layer groups \(body, head\)"): t.freeze_to(2)
    with pytest.raises(ValueError, match=r"one layer group \('all'\): freezing it leaves nothing to train. Give the trainer a `splitter`"):
        gpt_trainer().__class__(t.dls, nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 2)).freeze()

class Fits(Callback):
    "At the start of each fit: its epochs, each group's peak and first rate, which parameters train; each group's rate at the fit's last step"
    def __init__(self): self.fits = []
    def before_fit(self, t):
        self.fits.append(dict(n_epochs=t.n_epochs, peaks=[g['max_lr'] for g in t.opt.param_groups], first=[g['lr'] for g in t.opt.param_groups],
                              trains=[n for n, p in t.model.named_parameters() if p.requires_grad]))
    def before_step(self, t): self.fits[-1]['last'] = [g['lr'] for g in t.opt.param_groups]

def test_fine_tune_runs_a_frozen_fit_then_an_unfrozen_one_at_fastais_rates():
    t, fits = gpt_trainer(), Fits()
    t.fine_tune(2, base_lr=2e-3, callbacks=[fits])
    first, second = fits.fits
    layer = lambda rates: [rates[i] for i in (0, 1, 3, 5)]  # one group per layer group: embed, block0, block1, final
    assert first['n_epochs'] == 1 and layer(first['peaks']) == pytest.approx([2e-4, 2e-4, 2e-4, 2e-3])  # slice(base_lr)
    assert first['first'] == pytest.approx([p / 25 for p in first['peaks']])
    assert first['last'] == pytest.approx([p * tiny.fastai_one_cycle(4, 1, 0.99)[0][-1] for p in first['peaks']])  # fastai's: near the peak
    assert [n for n in first['trains'] if 'ln' not in n] == []  # the body and the tied head frozen; the layer norms train (train_bn)
    assert 'ln_f.weight' in first['trains'] and 'blocks.0.ln1.weight' in first['trains']
    assert second['n_epochs'] == 2 and layer(second['peaks']) == pytest.approx([1e-5 * 100 ** (i / 3) for i in range(4)])  # base_lr/2, lr_mult 100
    assert second['first'] == pytest.approx([p / 5 for p in second['peaks']])
    assert second['last'] == pytest.approx([p * tiny.fastai_one_cycle(8, 1, 0.3, div=5.)[0][-1] for p in second['peaks']])
    assert len(second['trains']) == 28
    with pytest.raises(ValueError, match='the trainer has OneCycleSchedulerCB'): gpt_trainer(OneCycleSchedulerCB()).fine_tune(1)

def eight_batch_trainer():
    "The tiny GPT on 8 batches an epoch, as the transfer-learning tutorial's"
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, 32, (32, 9), generator=g)
    dls = SimpleNamespace(train=[(toks[i:i+4, :-1], toks[i:i+4, 1:]) for i in range(0, 32, 4)], valid=[(toks[:4, :-1], toks[:4, 1:])])
    torch.manual_seed(0)
    return Trainer(dls, lm_loss, torch.optim.AdamW, get_model_gpt(32, n_layer=2, d_model=16, block_size=8), callbacks=[BasicTrainCB()])

def test_fine_tunes_rates_are_fastais_step_by_step():
    "Each step's rate and beta1 in both fits, against fastai's `fit_one_cycle` written out (tests/tiny.py): the frozen fit's last step at 0.94 of its peak (before: at its peak over 1e5, a step wasted; the one-cycle's rates up to 0.23 of the peak apart from fastai's)"
    rec = GroupLRs()
    class Betas(Callback):
        def before_fit(self, t): self.b = []
        def before_step(self, t): self.b.append(t.opt.param_groups[-1]['betas'][0])
    betas = Betas()
    t = eight_batch_trainer()
    fits = []
    class Each(Callback):
        def after_fit(self, t): fits.append(([r[-1] for r in rec.lrs], list(betas.b)))
    t.fine_tune(2, base_lr=1e-2, callbacks=[rec, betas, Each()])
    (frozen, frozen_b), (unfrozen, unfrozen_b) = fits
    lrs, moms = tiny.fastai_one_cycle(8, 1e-2, 0.99)  # the frozen fit: its head's peak base_lr, pct_start 0.99, div 25
    assert frozen == pytest.approx(lrs, rel=1e-9) and frozen_b == pytest.approx(moms, rel=1e-9)
    assert frozen[-1] == pytest.approx(9.68e-3, rel=1e-3)
    lrs, moms = tiny.fastai_one_cycle(16, 5e-3, 0.3, div=5.)  # then the head's peak base_lr / 2, pct_start 0.3, div 5, for 2 epochs
    assert unfrozen == pytest.approx(lrs, rel=1e-9) and unfrozen_b == pytest.approx(moms, rel=1e-9)


class SaveAt(Callback):
    "Save a checkpoint at the end of epoch `epoch`"
    def __init__(self, path, epoch): self.path, self.epoch = path, epoch
    def checkpoint(self, t, at):
        if at == 'epoch' and t.epoch == self.epoch: t.save_checkpoint(self.path)

def test_a_run_with_groups_and_a_freeze_resumes_exactly(tmp_path):
    "Rates per group on a one-cycle schedule, the body unfrozen after 6 of 12 steps: resumed before and after the unfreezing, the same weights"
    run = lambda *extra: dict(lr=slice(1e-4, 1e-2), callbacks=[OneCycleSchedulerCB(), UnfreezeCB('6 steps'), *extra])
    straight = gpt_trainer()
    straight.fit(3, **run(SaveAt(tmp_path/'e0.pt', 0), SaveAt(tmp_path/'e1.pt', 1)))
    state = torch.load(tmp_path/'e0.pt', weights_only=True)
    assert len(state['frozen']) == 18 and state['callbacks']['UnfreezeCB'] == {'start': 0, 'done': False}  # the blocks' norms train
    assert torch.load(tmp_path/'e1.pt', weights_only=True)['frozen'] == []
    for ckpt in ('e0.pt', 'e1.pt'):
        resumed = gpt_trainer(seed=1)
        resumed.fit(3, resume_from=tmp_path/ckpt, **run())
        assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(straight))), ckpt

def test_a_checkpoint_of_other_groups_is_refused_naming_them(tmp_path):
    t = gpt_trainer()
    t.fit(1, lr=slice(1e-4, 1e-2))
    t.save_checkpoint(tmp_path/'c.pt')
    other = gpt_trainer(seed=1)
    w = weights(other)
    with pytest.raises(CheckpointError, match=r"parameter groups have \[2, 4, 8, 4, 8, 2\] parameters, the trainer's \[8, 20\] \(named "
                       r"\['embed \(no decay\)', 'block0', .*, the trainer's \['all', 'all \(no decay\)'\]\): they changed"):
        other.fit(2, lr=1e-2, resume_from=tmp_path/'c.pt')
    other.no_decay = False
    with pytest.raises(CheckpointError, match=r"the trainer's \[2, 12, 12, 2\] \(named .*\['embed', 'block0', 'block1', 'final'\]\): they changed"):
        other.fit(2, lr=slice(1e-4, 1e-2), resume_from=tmp_path/'c.pt')
    assert all(torch.equal(a, b) for a, b in zip(weights(other), w))

class MySGD:
    "The course's hand-written SGD (notebook 16): no parameter groups"
    def __init__(self, params, lr): self.params, self.lr = list(params), lr
    def step(self):
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None: p -= self.lr * p.grad
    def zero_grad(self):
        for p in self.params: p.grad = None

def sgd(params, lr): return torch.optim.SGD(params, lr=lr, momentum=0.9)  # AIsaac's style: a function of `params` and `lr`

@pytest.mark.parametrize('opt_func', [torch.optim.SGD, partial(torch.optim.SGD, momentum=0.9), sgd, torch.optim.AdamW, MySGD],
                         ids=['SGD', 'partial', 'function', 'AdamW', 'hand-written'])
def test_miniai_and_aisaac_opt_funcs_work_as_before_and_with_a_slice(opt_func):
    t = gpt_trainer(opt_func=opt_func)
    t.fit(1, lr=0.1)
    made = opt_func(list(t.model.parameters()), lr=0.1)
    if isinstance(made, MySGD):
        assert type(t.opt) is MySGD and t.opt.params == made.params
        with pytest.raises(TypeError, match='MySGD has no parameter groups: give one learning rate'): t.fit(1, lr=slice(1e-3, 0.1))
        return
    if opt_func is torch.optim.AdamW: assert [len(g['params']) for g in t.opt.param_groups] == [8, 20]
    else:  # no weight decay: the optimizer as `opt_func` made it
        assert len(t.opt.param_groups) == 1 and t.opt.param_groups[0]['params'] == made.param_groups[0]['params']
        assert {k: v for k, v in t.opt.param_groups[0].items() if k != 'params'} == {k: v for k, v in made.param_groups[0].items() if k != 'params'}
    t.fit(1, lr=slice(1e-3, 0.1))
    assert {g['name']: g['lr'] for g in t.opt.param_groups} == pytest.approx({'embed': 1e-3, 'block0': 1e-3 * 100 ** (1/3), 'block1': 1e-3 * 100 ** (2/3), 'final': 0.1})
    assert {g.get('momentum') for g in t.opt.param_groups} == {made.param_groups[0].get('momentum')}

def test_a_model_without_parameters_is_refused_by_name():
    t = Trainer(SimpleNamespace(train=[(torch.randn(2, 3), torch.randn(2, 3))], valid=[]), nn.MSELoss(), torch.optim.SGD, nn.Flatten(),
                callbacks=[BasicTrainCB()])
    with pytest.raises(ValueError, match=r"The model \(Flatten\) has no parameters: there is nothing for an optimizer to train"): t.fit(1)

def test_lr_find_sweeps_every_group_and_keeps_a_slices_ratios():
    t = gpt_trainer()
    finder = t.lr_find(start_lr=slice(1e-9, 1e-7), max_epochs=2, plot=False)
    assert finder.lrs[0] == pytest.approx(1e-7) and len(finder.lrs) == 8  # the last group's rate, the one `fit(lr=slice(..., hi))` takes
    finder = t.lr_find(start_lr=1e-6, max_epochs=1, plot=False)
    assert finder.lrs == pytest.approx([1e-6 * 1.3 ** i for i in range(4)])

def test_lora_cannot_be_frozen_or_unfrozen_and_trains_its_adapters_with_groups():
    pytest.importorskip('peft')
    from aisaac.hf import lora
    t = gpt_trainer()
    t.model = lora(t.model, r=2, verbose=False)
    for how in (t.freeze, t.unfreeze, lambda: t.fine_tune(1)):
        with pytest.raises(TypeError, match=r"LoRA adapters \(peft\): LoRA freezes the base weights and trains its adapters"): how()
    base = {n: p.detach().clone() for n, p in t.model.named_parameters() if 'lora_' not in n}
    t.fit(1, lr=slice(1e-3, 1e-2))  # one layer group: the rate is the top one
    assert [g['lr'] for g in t.opt.param_groups] == [1e-2, 1e-2]
    assert all(torch.equal(p, base[n]) for n, p in t.model.named_parameters() if 'lora_' not in n)

TORCHRUN_CASES = HERE/'params_run.py', {c: [c] for c in ('fine_tune', 'ddp')}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/params_run.py: those the selected tests use run in one torchrun launch (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

@torchrun_cases.uses('fine_tune')
def test_fine_tune_under_fsdp_takes_the_steps_of_one_process(cases):
    "FSDPCB on 2 processes: the optimizer made on the shards has the groups, the body unfreezes after the sharding, and the losses and weights are one process's"
    import params_run
    r0, r1 = cases('fine_tune')
    ref = params_run.fine_tune_losses()
    assert r0['param_type'] == 'DTensor' and r0['fits'] == ref['fits'] and [f['trains'] for f in ref['fits']] == [10, 28]
    assert len(r0['losses']) == len(ref['losses']) == 8 and torch.allclose(torch.tensor(r0['losses']), torch.tensor(ref['losses']), atol=1e-5)
    assert r0['weights'] == r1['weights'] and torch.allclose(torch.tensor(r0['weights']), torch.tensor(ref['weights']), atol=1e-4)

@torchrun_cases.uses('ddp')
def test_freezing_a_model_in_distributed_data_parallel_is_refused(cases):
    r0, r1 = cases('ddp')
    assert r0['error'] == r1['error'] and r0['error'].startswith('RuntimeError: The model is wrapped in DistributedDataParallel')

def test_miniais_learner_decays_every_parameter_as_miniai_does():
    "SPEC 7: miniai's numbers where they depend on a default: its `Learner` with AdamW keeps one group, every parameter decayed"
    from aisaac.learner import Learner
    x = torch.randn(8, 4)
    dl = [(x, x.sum(1, keepdim=True))]
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 1))
    learn = Learner(model, SimpleNamespace(train=dl, valid=dl), lr=0.01, opt_func=torch.optim.AdamW, cbs=[BasicTrainCB()])
    learn.fit(1)
    assert len(learn.opt.param_groups) == 1 and learn.opt.param_groups[0]['weight_decay'] == 0.01
    t = Trainer(SimpleNamespace(train=dl, valid=dl), nn.MSELoss(), torch.optim.AdamW, model, callbacks=[BasicTrainCB()])
    t.fit(1)
    assert [g['weight_decay'] for g in t.opt.param_groups] == [0.01, 0.0]  # aisaac's own default: biases and norms not decayed

# ---------------------------------------------------------------- nanoGPT's rule: every 2-D parameter decays (embeddings too), no 1-D one
def _nanogpt_groups(model, wd, lr):
    "nanoGPT's `configure_optimizers`, written out: 2-D parameters decayed, then the others, each in the model's order"
    ps = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW([{'params': [p for p in ps if p.dim() >= 2], 'weight_decay': wd},
                              {'params': [p for p in ps if p.dim() < 2], 'weight_decay': 0.0}], lr=lr, betas=(0.9, 0.95))

def _hand_losses(model, batches, lr, steps):
    opt, losses = _nanogpt_groups(model, 0.1, lr), []
    for x, y in batches[:steps]:
        loss = lm_loss(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses

def test_no_decay_1d_is_nanogpts_rule_and_trains_as_its_configure_optimizers():
    "`trainer.no_decay = no_decay_1d`: the embeddings decay, the 1-D parameters do not, in nanoGPT's two groups; every loss is its loop's exactly"
    from aisaac.params import no_decay_1d
    class Losses(Callback):
        def before_fit(self, t): self.got = []
        def after_loss(self, t): self.got.append(t.loss.item())
    t = gpt_trainer(rec := Losses(), opt_func=partial(torch.optim.AdamW, weight_decay=0.1, betas=(0.9, 0.95)))
    t.no_decay = no_decay_1d
    groups = t.param_groups()
    assert [(g['name'], g['weight_decay']) for g in groups] == [('all', 0.1), ('all (no decay)', 0.0)]
    assert 'tok_emb.weight' in groups[0]['params'] and 'pos_emb.weight' in groups[0]['params']
    assert all(p.ndim < 2 for n, p in t.model.named_parameters() if n in groups[1]['params'])
    torch.manual_seed(0)
    ref = get_model_gpt(32, n_layer=2, d_model=16, block_size=8)
    hand = _hand_losses(ref, t.dls.train, 1e-2, 4)
    t.fit(1, lr=1e-2, valid=False)
    assert rec.got == hand
    t2 = gpt_trainer(rec2 := Losses(), opt_func=partial(torch.optim.AdamW, weight_decay=0.1, betas=(0.9, 0.95)))
    t2.fit(1, lr=1e-2, valid=False)  # the default: the embeddings are not decayed, so the run is not nanoGPT's
    assert rec2.got != hand

def test_show_groups_prints_a_line_per_group_when_the_fit_starts(capsys):
    "`trainer.show_groups = True`: each fit starts by printing its optimizer's groups, their size, rate and weight decay"
    t = gpt_trainer(opt_func=partial(torch.optim.AdamW, weight_decay=0.1))
    t.fit(1, lr=1e-2, valid=False)
    assert 'no decay' not in capsys.readouterr().out  # off by default
    t.show_groups = True
    t.fit(1, lr=1e-2, valid=False)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ['group', 'lr', 'decay', 'tensors', 'numel', 'trains', 'parameters']
    assert out[1].split()[:3] == ['all', '0.01', '0.1'] and out[2].split()[:5] == ['all', '(no', 'decay)', '0.01', '0']

def test_no_decay_takes_a_rule_of_its_own_and_refuses_anything_else():
    from aisaac.params import no_decay_1d
    t = gpt_trainer(opt_func=partial(torch.optim.AdamW, weight_decay=0.1))
    t.no_decay = lambda m: [m.head.weight]  # (tied to the token embedding)
    assert t.param_groups()[1]['params'] == ['tok_emb.weight']
    t.no_decay = 'nanogpt'
    with pytest.raises(TypeError, match=r"`trainer.no_decay` is True.*no_decay_1d"): t.param_groups()
