"""Preference tuning (`aisaac.pairs`, `PreferenceCB`): the published values (the policy as its own reference gives ln 2 and zero rewards,
torchtune's hand-computed cases), the reference's weights unchanged, the three references (a frozen copy, the adapters off, computed once)
agreeing, a loss that is a mean over pairs under accumulation (8 x 1 = 1 x 8), micro-batches and 2 processes, exact resume, refusals."""
import copy, math, warnings
from pathlib import Path
import pytest
import torch
import torch.nn.functional as F
from aisaac.pairs import fit_pairs, tokenize_pairs, pairs_dataloaders, count_pairs, PairBatch, pad_pairs
from aisaac.callbacks.preference import PreferenceCB, preference_loss, preference_metrics, precompute_reference, fingerprint, PairMean
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.gradients import MicroBatchCB
from aisaac.callbacks.savers import CheckpointCB, checkpoints
from aisaac.persist import CheckpointError
from aisaac.trainer import Trainer
import torchrun_cases
from posttrain_run import tiny_gpt, weights
from posttrain_cases import synthetic_pairs, pair_loaders, fit_pairs_run

HERE = Path(__file__).parent
LN2 = float(torch.tensor(math.log(2)))  # ln 2 in float32

# ------------------------------------------------------------------ published values
PC, PR = torch.tensor([-0.5, -10.0, -1.0]), torch.tensor([-0.1, -30.0, -21.0])  # torchtune's test_dpo_loss.py inputs
RC, RR = torch.tensor([-0.5, -10.1, -0.1]), torch.tensor([-0.1, -20.1, -0.1])

def test_torchtunes_hand_computed_cases():
    assert torch.allclose(preference_loss('dpo', PC, PR, RC, RR, beta=0.1)[0], torch.tensor([0.6931, 0.3133, 0.1269]), atol=1e-4)
    assert torch.allclose(preference_loss('hinge', PC, PR, RC, RR, beta=0.1)[0], torch.tensor([1., 0., 0.]), atol=1e-6)
    one = torch.ones(3)  # torchtune's SimPO case (removed from the file in 9b50628) takes these as average log-probabilities
    assert torch.allclose(preference_loss('simpo', PC, PR, len_chosen=one, len_rejected=one, beta=2.0, gamma=0.5)[0], torch.tensor([1.5410, 0., 0.]), atol=1e-4)

def test_simpo_with_beta_2_and_gamma_over_beta_a_quarter_gives_issue_49s_figures():
    "Average log-probability margins of 0.5, -0.5, 0.5: -logsigmoid(2 (m - 0.25)) = 0.4741, 1.7014, 0.4741"
    one = torch.ones(3)
    got = preference_loss('simpo', torch.tensor([-1.0, -2.0, -1.5]), torch.tensor([-1.5, -1.5, -2.0]), len_chosen=one, len_rejected=one, beta=2.0, gamma=0.5)[0]
    assert torch.allclose(got, torch.tensor([0.4741, 1.7014, 0.4741]), atol=1e-4)

def test_the_other_losses_hand_computed():
    h = torch.tensor([0., 1., 2.])  # beta * log-ratio differences of torchtune's case
    assert torch.allclose(preference_loss('dpo', PC, PR, RC, RR, beta=0.1, label_smoothing=0.2)[0], -0.8 * F.logsigmoid(h) - 0.2 * F.logsigmoid(-h))
    n = torch.tensor([2., 4., 5.])  # IPO: per-token log-ratios, minus 1 / (2 beta), squared
    want = ((PC - RC) / n - (PR - RR) / (n + 1) - 1 / 0.2) ** 2
    assert torch.allclose(preference_loss('ipo', PC, PR, RC, RR, n, n + 1, beta=0.1)[0], want)
    ac, ar = PC / n, PR / n  # ORPO: the chosen reply's NLL per token, minus beta log sigmoid(log odds ratio)
    odds = lambda a: a - torch.log1p(-torch.exp(a))
    assert torch.allclose(preference_loss('orpo', PC, PR, len_chosen=n, len_rejected=n, beta=0.1)[0], -ac - 0.1 * F.logsigmoid(odds(ac) - odds(ar)), atol=1e-6)

@pytest.mark.parametrize('pack', [False, True])
@pytest.mark.parametrize('loss', ['dpo', 'ipo', 'hinge'])
def test_a_policy_that_is_its_reference_gives_exactly_ln2_and_zero_rewards(pack, loss):
    "At the first step the frozen copy is the policy: DPO's loss is ln 2 to the bit, the hinge's 1, IPO's 1 / (2 beta)^2; every reward 0"
    dls = pair_loaders(synthetic_pairs(12), 4, pack=pack, length=40 if pack else 17)
    t = Trainer(dls, None, torch.optim.SGD, tiny_gpt(), callbacks=[PreferenceCB(loss, chunk=8), MetricsCB(**preference_metrics(), show=False)])
    t.fit(1, train=False)
    want = {'dpo': LN2, 'hinge': 1.0, 'ipo': float(torch.tensor(1 / 0.2) ** 2)}[loss]
    assert t.history.get_latest_metric('valid_loss') == want
    assert all(t.history.get_latest_metric(k) == 0 for k in ('rewards/chosen', 'rewards/rejected', 'rewards/margins'))

def test_the_reference_does_not_move_and_is_not_optimized():
    dls = pair_loaders(synthetic_pairs(12), 4, shuffle=True)
    model = tiny_gpt()
    before = copy.deepcopy(model.state_dict())
    rec, t = fit_pairs_run(model, dls, [PreferenceCB(chunk=8)], opt=torch.optim.AdamW, lr=1e-2)
    ref = t.PreferenceCB.ref
    assert all(torch.equal(ref.state_dict()[k], v) for k, v in before.items())  # the frozen copy is the policy's start, bit for bit
    assert not any(torch.equal(model.state_dict()[k], v) for k, v in before.items() if 'weight' in k)  # the policy moved
    assert not any(p.requires_grad for p in ref.parameters()) and not hasattr(t, 'ref_model')

def test_a_reference_given_as_a_model_is_frozen_during_the_fit_and_given_back_as_it_came():
    "PreferenceCB(reference=model): frozen and in evaluation mode while the fit runs; afterwards its mode and requires_grad flags are the "
    "user's again (before: left frozen, so training that model later raised 'element 0 of tensors does not require grad')"
    dls = pair_loaders(synthetic_pairs(12), 4, shuffle=True)
    ref = tiny_gpt(3).train()
    seen = []
    class During:
        def after_batch(self, trainer): seen.append((trainer.ref_model.training, any(p.requires_grad for p in trainer.ref_model.parameters())))
    fit_pairs_run(tiny_gpt(), dls, [PreferenceCB(reference=ref, chunk=8), During()], opt=torch.optim.AdamW, lr=1e-2)
    assert seen and set(seen) == {(False, False)}
    assert ref.training and all(p.requires_grad for p in ref.parameters())

# ------------------------------------------------------------------ the three references
def _losses_and_grads(dls, model, cb):
    "The first batch's loss and gradients"
    grads = []
    class Grab:
        def after_backward(self, t): grads.append(torch.cat([p.grad.flatten() for p in t.model.parameters() if p.grad is not None]).clone())
    rec, _ = fit_pairs_run(model, dls, [cb, Grab()])
    return rec.losses, grads

def test_precomputed_reference_equals_the_live_one():
    pairs = synthetic_pairs(12)
    dls = pair_loaders(pairs, 4)
    start = tiny_gpt()
    live = _losses_and_grads(dls, copy.deepcopy(start), PreferenceCB(reference=copy.deepcopy(start), chunk=8))
    pre = precompute_reference(dls, copy.deepcopy(start), chunk=8, bs=3)  # other batches: other cuts, the same values
    got = _losses_and_grads(pre, copy.deepcopy(start), PreferenceCB(chunk=8))
    assert got[0] == pytest.approx(live[0], abs=1e-6)
    for a, b in zip(got[1], live[1]): assert torch.allclose(a, b, atol=1e-6)

def test_precomputed_reference_for_aligned_labels_and_packed_rows():
    "With a Hugging Face model's aligned labels and packed rows, the batches' ref_logps give the same step as the live reference"
    transformers = pytest.importorskip('transformers')
    transformers.logging.set_verbosity_error()
    def gpt2():
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=40, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0., embd_pdrop=0., attn_pdrop=0.))
    from aisaac.pairs import pack_pairs
    from aisaac.data import DataLoaders, TensorLoader
    rows = pack_pairs(synthetic_pairs(12), 40, 0)
    dls = DataLoaders(TensorLoader(*rows, bs=2, tfm=PairBatch(hf_labels=True, block_mask=True)), TensorLoader(*rows, bs=2, tfm=PairBatch(True, True)))
    dls.hf_labels = True
    live = _losses_and_grads(dls, gpt2(), PreferenceCB(reference=gpt2(), chunk=8))
    got = _losses_and_grads(precompute_reference(dls, gpt2(), chunk=8), gpt2(), PreferenceCB(chunk=8))
    assert live[0][0] == pytest.approx(LN2, abs=1e-7) and got[0] == pytest.approx(live[0], abs=1e-6)

def test_fresh_adapters_switched_off_are_the_reference_and_trained_ones_are_refused():
    from aisaac.hf import lora
    pairs = synthetic_pairs(12)
    dls = pair_loaders(pairs, 4)
    torch.manual_seed(1)
    model = lora(tiny_gpt(), r=4, verbose=False)
    base = copy.deepcopy(model.get_base_model())
    adapters = _losses_and_grads(dls, copy.deepcopy(model), PreferenceCB(reference='adapters', chunk=8))
    frozen = _losses_and_grads(dls, copy.deepcopy(model), PreferenceCB(reference=base, chunk=8))
    assert adapters[0] == pytest.approx(frozen[0], abs=1e-6) and adapters[0][0] == LN2
    _, t = fit_pairs_run(model, dls, [PreferenceCB(chunk=8)], lr=0.5)  # 'auto': the adapters, for a peft model
    assert t.PreferenceCB.kind == 'adapters'
    with pytest.raises(ValueError, match='adapters were trained before'): fit_pairs_run(model, dls, [PreferenceCB(chunk=8)])

# ------------------------------------------------------------------ a mean over pairs
def test_accumulation_8_by_1_equals_1_by_8_and_micro_batches_too():
    pairs = synthetic_pairs(8)
    ref, _ = fit_pairs_run(tiny_gpt(), pair_loaders(pairs, 8), [PreferenceCB(chunk=8)])
    m8 = tiny_gpt(); acc, _ = fit_pairs_run(m8, pair_loaders(pairs, 1), [PreferenceCB(chunk=8)], n_accum=8)
    mm = tiny_gpt(); mic, _ = fit_pairs_run(mm, pair_loaders(pairs, 8), [PreferenceCB(chunk=8), MicroBatchCB(8)])
    m1 = tiny_gpt(); fit_pairs_run(m1, pair_loaders(pairs, 8), [PreferenceCB(chunk=8)])
    assert acc.norms == pytest.approx(ref.norms, rel=1e-5) and mic.norms == pytest.approx(ref.norms, rel=1e-5)
    assert sum(acc.losses) / 8 == pytest.approx(ref.losses[0], rel=1e-6)
    for m in (m8, mm): assert torch.allclose(torch.tensor(weights(m)), torch.tensor(weights(m1)), atol=1e-6)

def test_packed_micro_batches_weigh_by_their_pairs():
    "Packed rows hold different numbers of pairs: micro-batches of rows, under accumulation, give the step of all the pairs at once"
    pairs = synthetic_pairs(10)
    dls = pair_loaders(pairs, 4, pack=True, length=40)
    n = [count_pairs(b).item() for b in dls.train]
    assert len(set(n)) > 1 or len(n) == 1
    rows = len(dls.train.tensors[0])
    ref, _ = fit_pairs_run(tiny_gpt(), pair_loaders(pairs, rows, pack=True, length=40), [PreferenceCB(chunk=8)])
    got, _ = fit_pairs_run(tiny_gpt(), pair_loaders(pairs, 1, pack=True, length=40), [PreferenceCB(chunk=8)], n_accum=rows)
    assert got.norms == pytest.approx(ref.norms, rel=1e-5)

TORCHRUN_CASES = HERE/'posttrain_run.py', {'dpo': ['dpo']}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/posttrain_run.py, run in one torchrun launch with the other cases the selected tests use (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

@torchrun_cases.uses('dpo')
def test_two_processes_equal_one_step_by_step(cases):
    "2 processes (torchrun, gloo, DDP), each 2 of every 4 pairs: each step's mean loss and gradient norm are one process's on the 4"
    res = cases('dpo')
    model = tiny_gpt()
    one, _ = fit_pairs_run(model, pair_loaders(synthetic_pairs(16), 4), [PreferenceCB(reference=tiny_gpt(), chunk=8)])
    for r in res: assert r['norms'] == pytest.approx(one.norms, rel=1e-5)
    assert [(a + b) / 2 for a, b in zip(res[0]['losses'], res[1]['losses'])] == pytest.approx(one.losses, rel=1e-6)
    assert torch.allclose(torch.tensor(res[0]['weights']), torch.tensor(weights(model)), atol=1e-6)

# ------------------------------------------------------------------ resume
def test_a_resumed_run_is_exact_and_a_resume_against_another_reference_is_refused(tmp_path):
    dls = pair_loaders(synthetic_pairs(24), 4, shuffle=True)
    def make(cb): return Trainer(dls, None, torch.optim.AdamW, tiny_gpt(), callbacks=[cb])
    straight = make(PreferenceCB(chunk=8)); straight.fit(2, callbacks=[CheckpointCB(tmp_path, every_n_batches=4, keep_last=None)])
    inside = checkpoints(tmp_path)[0]
    resumed = make(PreferenceCB(chunk=8)); resumed.fit(2, resume_from=inside)  # its copy is made of a fresh model, then the checkpoint's loaded
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()): assert torch.equal(a, b)
    other = make(PreferenceCB(reference=tiny_gpt(seed=5), chunk=8))
    with pytest.raises(CheckpointError, match="reference is 'copy', this PreferenceCB's 'model'"): other.fit(2, resume_from=inside)
    given = Trainer(dls, None, torch.optim.AdamW, tiny_gpt(), callbacks=[PreferenceCB(reference=tiny_gpt(), chunk=8)])
    given.fit(1, callbacks=[CheckpointCB(tmp_path/'given')])
    again = Trainer(dls, None, torch.optim.AdamW, tiny_gpt(), callbacks=[PreferenceCB(reference=tiny_gpt(seed=5), chunk=8)])
    with pytest.raises(CheckpointError, match='against a reference with fingerprint'): again.fit(2, resume_from=checkpoints(tmp_path/'given')[-1])

# ------------------------------------------------------------------ data and refusals
def test_pairs_cut_the_prompt_first_and_drop_those_with_nothing_left_counting_them():
    pairs = synthetic_pairs(6)
    long = {**pairs[0], 'prompt': list(range(2, 30))}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        out = fit_pairs([long], 16)
    assert len(out[0]['prompt']) == max(16 - max(len(long['chosen']), len(long['rejected'])), 8) and out[0]['prompt'] == long['prompt'][-len(out[0]['prompt']):]
    assert 'lost their start' in str(w[0].message)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        assert fit_pairs([long] + pairs[1:], 16, keep_prompt=16)[0] == fit_pairs(pairs[1:2], 16)[0]
    assert '1 of 6 pairs were dropped' in str(w[0].message)

def test_refusals_name_the_problem():
    dls = pair_loaders(synthetic_pairs(4), 2)
    with pytest.raises(ValueError, match="The 'simpo' loss needs no reference"): PreferenceCB('simpo', reference='copy')
    with pytest.raises(ValueError, match='Unknown preference loss'): PreferenceCB('kto')
    model = tiny_gpt()
    with pytest.raises(ValueError, match='shares weights with the policy'): fit_pairs_run(model, dls, [PreferenceCB(reference=model)])
    with pytest.raises(ValueError, match="this model has none"): fit_pairs_run(tiny_gpt(), dls, [PreferenceCB(reference='adapters')])
    with pytest.raises(ValueError, match='make the loaders with `precompute_reference'): fit_pairs_run(tiny_gpt(), dls, [PreferenceCB(reference='precomputed')])

def test_reference_free_losses_train():
    dls = pair_loaders(synthetic_pairs(8), 4)
    for loss in ('simpo', 'orpo'):
        rec, t = fit_pairs_run(tiny_gpt(), dls, [PreferenceCB(loss, chunk=8)], n_epochs=2)
        assert t.PreferenceCB.kind is None and all(math.isfinite(l) for l in rec.losses)

# ------------------------------------------------------------------ the reward model
def test_bradley_terry_reward_model_padded_equals_packed_and_accumulation_is_a_mean_over_pairs():
    from aisaac.callbacks.reward import RewardModel, RewardCB
    pairs = synthetic_pairs(8)
    def rm(): return RewardModel(tiny_gpt())
    scores = []
    class Keep:
        def after_predict(self, t): scores.append(t.preds.clone())
    for pack in (False, True):
        fit_pairs_run(rm(), pair_loaders(pairs, 8, pack=pack, length=40 if pack else 17), [RewardCB(), Keep()], lr=0.)
    a, b = scores
    assert torch.allclose(a[a[:, 0].argsort()], b[b[:, 0].argsort()], atol=1e-5)  # (packed pairs come in another order)
    r = a[:, :2]
    ref, _ = fit_pairs_run(rm(), pair_loaders(pairs, 8), [RewardCB()])
    assert ref.losses[0] == pytest.approx(-F.logsigmoid(r[:, 0] - r[:, 1]).mean().item(), rel=1e-6)
    acc, _ = fit_pairs_run(rm(), pair_loaders(pairs, 1), [RewardCB()], n_accum=8)
    assert acc.norms == pytest.approx(ref.norms, rel=1e-5)

@pytest.mark.parametrize('loss', ['dpo', 'simpo'])
def test_disable_dropout_turns_the_policys_and_references_dropout_off_for_the_fit_and_gives_it_back(loss):
    "TRL's default: with dropout on, the policy's log-ratios against its reference are noise; off, the first DPO loss is ln 2 exactly"
    from aisaac.models import GPT
    def model(): torch.manual_seed(0); return GPT(50, n_layer=2, n_head=2, d_model=16, block_size=48, dropout=0.5)
    seen = []
    class During:
        def after_loss(self, trainer):
            if trainer.model.training: seen.append(trainer.model.drop.p); seen.append(trainer.model.blocks[0].attn.dropout)
    dls = pair_loaders(synthetic_pairs(8), 4)
    for off in (True, False):
        seen.clear(); m = model()
        rec, _ = fit_pairs_run(m, dls, [PreferenceCB(loss, disable_dropout=off), During()])
        assert set(seen) == ({0.} if off else {0.5})
        assert m.drop.p == 0.5 and m.blocks[0].attn.dropout == 0.5 and m.blocks[0].mlp[-1].p == 0.5  # given back after the fit
        if loss == 'dpo': assert (rec.losses[0] == pytest.approx(LN2, abs=1e-6)) == off  # the policy is its reference at the first batch

@pytest.mark.parametrize('kind', ['preference', 'reward'])
def test_a_pair_trainer_summarizes_its_model_on_the_pairs_rows_and_refuses_item_losses_by_name(kind):
    """`summarize_model` on a PreferenceCB or RewardCB trainer runs the model on the pairs' rows, as the step does (`model_inputs`: 2B rows);
    it raised `ValueError: too many values to unpack` (the model got (B, 2, T) ids). `Interpretation` needs each item's loss from a
    `loss_func`, which a pair trainer has not: the error names the callback and the way out (it raised `'NoneType' object is not callable`)"""
    from aisaac import setups
    from aisaac.callbacks.interpret import Interpretation
    t = (setups.tiny_preference_trainer if kind == 'preference' else setups.tiny_reward_trainer)([MetricsCB(show=False)])
    b = t.peek_batch()
    s = t.summarize_model()
    assert f"({2 * len(b['input_ids'])}, {b['input_ids'].shape[-1]})" in str(s), str(s)[:300]
    with pytest.raises(ValueError, match=f"{'PreferenceCB' if kind == 'preference' else 'RewardCB'} computes the loss itself.*capture_preds"):
        Interpretation.from_trainer(t)
