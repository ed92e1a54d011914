"""Distillation (`DistillCB`, `aisaac.callbacks.topk`): TRL's properties of the generalized JSD, a one-hot teacher's forward KL is the
cross-entropy, the teacher frozen and moved like any extra module, offline top-k with k = the vocabulary equal to the online loss,
the shards checksummed and matched to their rows, the teacher's fingerprint in checkpoints (a resume with another refused, the same exact),
token-weighted accumulation and 2 processes equal to one batch."""
import copy, math
from pathlib import Path
import pytest
import torch
import torch.nn.functional as F
from aisaac.callbacks.distill import DistillCB, divergence, generalized_jsd
from aisaac.callbacks.topk import teacher_topk, with_teacher_topk, TeacherTopK
from aisaac.callbacks.chunked import ChunkedLossCB
from aisaac.callbacks.devices import MoveModulesToDeviceCB
from aisaac.callbacks.savers import CheckpointCB, checkpoints
from aisaac.callbacks.gradients import MicroBatchCB, GradAccumCB
from aisaac.callbacks.preference import fingerprint
from aisaac.data import DataLoaders, TensorLoader
from aisaac.models import lm_loss
from aisaac.persist import CheckpointError
from aisaac.shards import ShardError
from aisaac.trainer import Trainer
import torchrun_cases
from posttrain_run import Record, tiny_gpt, weights
from posttrain_cases import distill_batches, distill_fit, V

HERE = Path(__file__).parent

def test_trls_jsd_properties():
    torch.manual_seed(0)
    s, t = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    assert torch.allclose(generalized_jsd(s, s), torch.zeros(2, 3), atol=1e-6) and generalized_jsd(torch.ones(1, 5), torch.ones(1, 5)).abs().max() < 1e-6
    st, ts = (torch.log(torch.tensor([[0.1, 0.9]]))[None], torch.log(torch.tensor([[0.9, 0.1]]))[None])  # TRL's edge case
    assert torch.allclose(generalized_jsd(st, ts, beta=1).mean(), F.kl_div(F.log_softmax(ts, -1), F.softmax(st, -1), reduction='batchmean'), atol=1e-5)
    assert torch.allclose(generalized_jsd(st, ts, beta=0).mean(), F.kl_div(F.log_softmax(st, -1), F.softmax(ts, -1), reduction='batchmean'), atol=1e-5)
    assert torch.allclose(generalized_jsd(s, t, 0.5), generalized_jsd(t, s, 0.5), atol=1e-6)
    assert not torch.allclose(generalized_jsd(s, t, 0.1), generalized_jsd(t, s, 0.1), atol=1e-3)
    assert generalized_jsd(s, t, 0) .ne(generalized_jsd(s, t, 1)).all()

def test_forward_kl_of_a_one_hot_teacher_is_the_cross_entropy_in_training_too():
    "Offline batches whose teacher is sure of each label (its whole vocabulary stored, log-probability 0 at the label): DistillCB's loss and step are ChunkedLossCB's"
    batches = distill_batches()
    def sure(b):
        ids = torch.arange(V).expand(*b['labels'].shape, V)
        lps = torch.full((*b['labels'].shape, V), -float('inf')).scatter(-1, b['labels'].clamp(min=0)[..., None], 0.)
        return {**b, 'teacher_ids': ids, 'teacher_logps': lps}
    dls = DataLoaders([sure(b) for b in batches], [sure(batches[0])]); dls.teacher_fingerprint = 'one-hot'
    plain = DataLoaders(batches, batches[:1])
    a, b = Record(), Record()
    Trainer(plain, lm_loss, torch.optim.SGD, tiny_gpt(), callbacks=[ChunkedLossCB(chunk=8), a]).fit(1, lr=0.5, valid=False)
    Trainer(dls, lm_loss, torch.optim.SGD, tiny_gpt(), callbacks=[DistillCB(alpha=1., chunk=8), b]).fit(1, lr=0.5, valid=False)
    assert b.losses == pytest.approx(a.losses, rel=1e-6) and b.norms == pytest.approx(a.norms, rel=1e-5)

def test_the_teacher_runs_frozen_is_moved_like_any_extra_module_and_does_not_change():
    teacher = tiny_gpt(7)
    before = fingerprint(teacher)
    mover = MoveModulesToDeviceCB()
    batches = distill_batches()
    seen = []
    class During:
        def after_batch(self, trainer): seen.append((trainer.teacher.training, any(p.requires_grad for p in trainer.teacher.parameters())))
    teacher.train(); next(teacher.parameters()).requires_grad_(False)  # (a flag of the user's own, given back too)
    given = [p.requires_grad for p in teacher.parameters()]
    Trainer(DataLoaders(batches, batches[:1]), lm_loss, torch.optim.AdamW, tiny_gpt(), callbacks=[DistillCB(teacher), mover, During()]).fit(1)
    assert 'teacher' in mover.moved and fingerprint(teacher) == before and all(p.grad is None for p in teacher.parameters())
    assert seen and set(seen) == {(False, False)}  # frozen, in evaluation mode, during the fit
    # then given back as it came, so that a teacher trained later trains (before: left in evaluation mode without gradients,
    # and a later fit of it raised 'element 0 of tensors does not require grad')
    assert teacher.training and [p.requires_grad for p in teacher.parameters()] == given

def _sft_loaders(seed=0, shuffle=True, hf=False):
    "TensorLoaders of padded SFT-like rows (the first 3 labels masked), with aisaac's shifted labels (or, `hf`, aligned ones)"
    from aisaac.sft import SFTBatch
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (12, 14), generator=g)
    labels = ids.clone(); labels[:, :4] = -100
    lens = torch.randint(9, 15, (12,), generator=g)
    for i, n in enumerate(lens): ids[i, n:], labels[i, n:] = 0, -100
    dl = lambda sh: TensorLoader(ids, labels, lens, bs=4, shuffle=sh, seed=0, tfm=SFTBatch(hf))
    dls = DataLoaders(dl(shuffle), dl(False))
    dls.hf_labels = hf
    return dls

def _tiny_gpt2():
    transformers = pytest.importorskip('transformers')
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0., embd_pdrop=0., attn_pdrop=0.))

@pytest.mark.parametrize('hf', [False, True])
@pytest.mark.parametrize('loss', ['forward_kl', 'reverse_kl', 'jsd'])
def test_offline_top_k_of_the_whole_vocabulary_equals_the_online_loss(tmp_path, loss, hf):
    "aisaac's GPT on shifted labels, and (hf) a transformers GPT-2 student shifting aligned labels itself (its own loss), the teacher aisaac's GPT"
    teacher = tiny_gpt(7)
    dls = _sft_loaders(hf=hf)
    topk = teacher_topk(teacher, dls, tmp_path/'topk', k=V, chunk=8, bs=5)  # batches of rows other than the training ones
    off = with_teacher_topk(dls, topk)  # made before any epoch: the same batches
    cb = lambda t=None: DistillCB(t, loss, beta=0.4, temperature=1.5, alpha=0.6, chunk=8)
    student = _tiny_gpt2 if hf else tiny_gpt
    a, b = Record(), Record()
    Trainer(dls, None if hf else lm_loss, torch.optim.SGD, student(), callbacks=[cb(teacher), a]).fit(1, lr=0.5, valid=False)
    Trainer(off, None if hf else lm_loss, torch.optim.SGD, student(), callbacks=[cb(), b]).fit(1, lr=0.5, valid=False)
    assert b.losses == pytest.approx(a.losses, rel=1e-5) and b.norms == pytest.approx(a.norms, rel=1e-4)

def test_the_stored_top_k_are_checksummed_matched_to_their_rows_and_computed_once(tmp_path):
    teacher = tiny_gpt(7)
    dls = _sft_loaders()
    topk = teacher_topk(teacher, dls, tmp_path/'topk', k=8, dtype='float16')
    ids, lps = topk.read(0, 3)
    assert ids.shape == (3, 8) and lps.dtype == torch.float32 and (lps[:, :-1] >= lps[:, 1:]).all()  # the likeliest first
    mtime = (tmp_path/'topk'/'shards.json').stat().st_mtime_ns
    assert teacher_topk(teacher, dls, tmp_path/'topk', k=8, dtype='float16').meta == topk.meta and (tmp_path/'topk'/'shards.json').stat().st_mtime_ns == mtime
    with pytest.raises(ShardError, match='holds other top-k'): teacher_topk(tiny_gpt(8), dls, tmp_path/'topk', k=8, dtype='float16')
    with pytest.raises(ValueError, match="rows are not those the teacher's top-k were computed on"): with_teacher_topk(_sft_loaders(seed=1), topk)
    aligned = with_teacher_topk(dls, teacher_topk(teacher, dls, tmp_path/'aligned', k=8, shift=True))  # stored for a student that shifts
    with pytest.raises(ValueError, match='stored for labels aligned with the inputs'):
        Trainer(aligned, lm_loss, torch.optim.SGD, tiny_gpt(), callbacks=[DistillCB()]).fit(1)
    shard = next((tmp_path/'topk').glob('tokens_*.bin'))
    data = bytearray(shard.read_bytes()); data[10] ^= 0xFF; shard.write_bytes(bytes(data))
    import aisaac.shards as sh; sh._verified.clear()
    with pytest.raises(ShardError, match='is corrupt'): TeacherTopK(tmp_path/'topk')

def test_accumulation_and_micro_batches_equal_one_big_batch():
    batches = distill_batches()
    big = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    ref = distill_fit(tiny_gpt(), [big], [], 1)
    assert distill_fit(tiny_gpt(), batches, [], 4).norms == pytest.approx(ref.norms, rel=1e-5)
    assert distill_fit(tiny_gpt(), [big], [MicroBatchCB(4)], 1).norms == pytest.approx(ref.norms, rel=1e-5)

TORCHRUN_CASES = HERE/'posttrain_run.py', {'distill': ['distill']}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/posttrain_run.py, run in one torchrun launch with the other cases the selected tests use (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

@torchrun_cases.uses('distill')
def test_two_processes_equal_one(cases):
    res = cases('distill')
    model = tiny_gpt()
    one = distill_fit(model, distill_batches(), [], 4)
    for r in res:
        assert r['norms'] == pytest.approx(one.norms, rel=1e-5)
        assert torch.allclose(torch.tensor(r['weights']), torch.tensor(weights(model)), atol=1e-6)

def test_the_teachers_fingerprint_is_in_checkpoints_and_a_resume_is_exact_with_it_and_refused_with_another(tmp_path):
    dls = _sft_loaders()
    def make(teacher): return Trainer(dls, lm_loss, torch.optim.AdamW, tiny_gpt(), callbacks=[DistillCB(teacher, chunk=8)])
    straight = make(tiny_gpt(7)); straight.fit(2, callbacks=[CheckpointCB(tmp_path, every_n_batches=2, keep_last=None)])
    inside = checkpoints(tmp_path)[0]
    assert torch.load(inside, weights_only=True)['callbacks']['DistillCB']['teacher'] == fingerprint(tiny_gpt(7))
    resumed = make(tiny_gpt(7)); resumed.fit(2, resume_from=inside)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()): assert torch.equal(a, b)
    with pytest.raises(CheckpointError, match='distilled from the teacher with fingerprint'): make(tiny_gpt(8)).fit(2, resume_from=inside)

def test_refusals_name_the_problem():
    batches = distill_batches()
    dls = DataLoaders(batches, batches[:1])
    def fit(cb, model=None): Trainer(dls, lm_loss, torch.optim.SGD, model or tiny_gpt(), callbacks=[cb]).fit(1)
    with pytest.raises(ValueError, match='DistillCB has no teacher'): fit(DistillCB())
    with pytest.raises(ValueError, match='share a tokenizer'): fit(DistillCB(tiny_gpt(vocab=60)))
    student = tiny_gpt()
    with pytest.raises(ValueError, match='shares weights with the student'): fit(DistillCB(student), student)
    with pytest.raises(ValueError, match='Unknown distillation loss'): DistillCB(loss='kl')
    with pytest.raises(ValueError, match='`beta` is between 0'): DistillCB(loss='jsd', beta=2)

class _SeenBatches:
    "Each training batch as the loss saw it (`input_ids`, `labels`), and whether the student was training then"
    order = 50
    def __init__(self): self.batches, self.modes = [], []
    def after_loss(self, trainer):
        if trainer.model.training: self.batches.append({k: trainer.batch[k].clone() for k in ('input_ids', 'labels')}); self.modes.append(trainer.model.training)

def test_on_policy_with_lmbda_0_is_the_online_distillation_bit_for_bit():
    runs = []
    for cb in (DistillCB(tiny_gpt(7), 'reverse_kl', chunk=8), DistillCB(tiny_gpt(7), 'reverse_kl', chunk=8, lmbda=0., max_new_tokens=5)):
        rec = Record(); t = Trainer(_sft_loaders(), lm_loss, torch.optim.AdamW, tiny_gpt(), callbacks=[cb, rec]); t.fit(2)
        runs.append((rec.losses, weights(t.model), torch.random.get_rng_state()))
    (la, wa, ra), (lb, wb, rb) = runs
    assert la == lb and wa == wb and torch.equal(ra, rb)

@pytest.mark.parametrize('hf', [False, True])
def test_on_policy_with_lmbda_1_trains_on_the_students_samples_the_prompt_masked(hf):
    dls = _sft_loaders(hf=hf, shuffle=False)
    teacher = tiny_gpt(7); before = fingerprint(teacher)
    seen = _SeenBatches()
    student = _tiny_gpt2() if hf else tiny_gpt()
    Trainer(dls, None if hf else lm_loss, torch.optim.SGD, student, callbacks=[DistillCB(teacher, 'reverse_kl', chunk=8, lmbda=1., max_new_tokens=6), seen]).fit(1, lr=0.5, valid=False)
    data = [b for b in dls.train]
    assert len(seen.batches) == len(data) and all(seen.modes)  # training mode given back after each sampling
    for s, d in zip(seen.batches, data):
        p = 4  # every row's first 4 labels (aligned) are masked: the prompt is 4 tokens
        x, y = s['input_ids'], s['labels']
        assert x.shape == (4, p + 6 - (0 if hf else 1)) and torch.equal(x[:, :p], d['input_ids'][:, :p])  # the data's prompt, then the samples
        n_masked = p if hf else p - 1
        assert (y[:, :n_masked] == -100).all() and (y[:, n_masked:] != -100).all()  # labels on the generated tokens only
        if not hf: assert torch.equal(y[:, :-1][:, n_masked:], x[:, 1:][:, n_masked:])  # the next tokens of the sample
        else: assert torch.equal(y[:, p:], x[:, p:])
        assert not torch.equal(x[:, p:], d['input_ids'][:, p:x.shape[1]])  # not the data's reply
    assert fingerprint(teacher) == before and all(p.grad is None for p in teacher.parameters())  # the teacher gets no gradients

def test_on_policy_draws_lmbda_of_the_batches_and_a_resume_is_exact(tmp_path):
    dls = _sft_loaders()
    def make(): return Trainer(dls, lm_loss, torch.optim.AdamW, tiny_gpt(), callbacks=[DistillCB(tiny_gpt(7), 'jsd', chunk=8, lmbda=0.5, max_new_tokens=4, sample_top_k=10)])
    seen = _SeenBatches()
    straight = make(); straight.fit(2, callbacks=[CheckpointCB(tmp_path, every_n_batches=2, keep_last=None), seen])
    widths = {s['input_ids'].shape[1] for s in seen.batches}
    assert len(widths) > 1 and 4 + 4 - 1 in widths  # some batches sampled (prompt 4 + 4 new, shifted), some the data's
    resumed = make(); resumed.fit(2, resume_from=checkpoints(tmp_path)[0])
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()): assert torch.equal(a, b)

def test_on_policy_under_gradient_accumulation_steps_once_a_window():
    dls = _sft_loaders()
    rec = Record()
    Trainer(dls, lm_loss, torch.optim.SGD, tiny_gpt(), callbacks=[DistillCB(tiny_gpt(7), chunk=8, lmbda=1., max_new_tokens=4), GradAccumCB(3), rec]).fit(1, lr=0.5, valid=False)
    assert len(rec.losses) == 3 and len(rec.norms) == 1 and all(math.isfinite(n) and n > 0 for n in rec.norms)

def test_on_policy_refusals_name_the_problem():
    with pytest.raises(ValueError, match='`lmbda` is the share'): DistillCB(tiny_gpt(7), lmbda=1.5)
    with pytest.raises(ValueError, match='needs a teacher to score'): DistillCB(lmbda=0.5)
    batches = [(b['input_ids'], b['labels']) for b in distill_batches()]
    with pytest.raises(ValueError, match='reads the prompts from a dict batch'):
        Trainer(DataLoaders(batches, batches[:1]), lm_loss, torch.optim.SGD, tiny_gpt(), callbacks=[DistillCB(tiny_gpt(7), lmbda=1.)]).fit(1)
