"""The chunked loss (`aisaac.chunked`, `ChunkedLossCB`): the same loss and gradients as `F.cross_entropy` on the whole logits (float32,
1e-6) for any chunk, either way to the gradient, under autocast and with a bias; the same training as `BasicTrainCB` for aisaac's GPT,
transformers' GPT-2 and Llama and a LoRA model; exact under token-weighted accumulation and micro-batches, across 2 processes (one with a
micro-batch masked throughout, which must not hang) and through a resume; what it keeps for the backward pass."""
import copy
from pathlib import Path
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from aisaac.chunked import chunked_lm_loss, chunked_logprobs, chunked_token_loss
from aisaac.callbacks.chunked import ChunkedLossCB, hidden_states, output_layer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.gradients import GradAccumCB, MicroBatchCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.savers import CheckpointCB, checkpoints
from aisaac.models import lm_loss
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders
import torchrun_cases
from posttrain_run import Record, chunked_batches, fit, tiny_gpt, weights

HERE = Path(__file__).parent

def _plain_and_chunked(h, head, y, **kw):
    "The mean loss and its gradients (hidden states, weight, bias): F.cross_entropy's on the whole logits, then the chunked one's"
    out = []
    for f in (lambda: F.cross_entropy(head(h).flatten(0, -2).float(), y.flatten()), lambda: chunked_lm_loss(h, head, y, reduction='mean', **kw)):
        h.grad = None; head.zero_grad(set_to_none=True)
        loss = f(); loss.backward()
        out.append([loss.detach(), h.grad.clone(), head.weight.grad.clone(), *([head.bias.grad.clone()] if head.bias is not None else [])])
    return out

@pytest.mark.parametrize('chunk', [1, 5, 64, 1000])
@pytest.mark.parametrize('recompute', [False, True])
@pytest.mark.parametrize('bias', [False, True])
def test_loss_and_gradients_equal_cross_entropys(chunk, recompute, bias):
    torch.manual_seed(chunk)
    h, head = torch.randn(4, 33, 24, requires_grad=True), nn.Linear(24, 97, bias=bias)
    y = torch.randint(0, 97, (4, 33)); y[:, :7] = -100; y[3, 20:] = -100
    (l0, *g0), (l1, *g1) = _plain_and_chunked(h, head, y, chunk=chunk, recompute=recompute)
    assert torch.allclose(l1, l0, rtol=1e-6, atol=0)
    for a, b in zip(g1, g0): assert torch.allclose(a, b, rtol=0, atol=1e-6), (a - b).abs().max()

def test_mean_is_over_the_positions_with_a_label():
    torch.manual_seed(0)
    h, head, y = torch.randn(2, 9, 8), nn.Linear(8, 30), torch.randint(0, 30, (2, 9))
    y[0, :4] = -100
    assert torch.allclose(chunked_lm_loss(h, head, y, chunk=4, reduction='mean'), F.cross_entropy(head(h).flatten(0, 1), y.flatten()), atol=1e-6)
    with pytest.raises(ValueError, match="`reduction` is 'sum' or 'mean'"): chunked_lm_loss(h, head, y, reduction='none')

def test_under_autocast_the_logits_are_made_in_its_dtype_as_the_plain_layers():
    torch.manual_seed(0)
    h, head, y = torch.randn(3, 16, 32), nn.Linear(32, 64, bias=False), torch.randint(0, 64, (3, 16))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        plain, chunked = lm_loss(head(h), y), chunked_lm_loss(h, head, y, chunk=8, reduction='mean')
    assert chunked.dtype == torch.float32 and abs(chunked.item() - plain.item()) < 1e-3  # the same bfloat16 logits, summed in float32

def test_log_probs_and_their_gradient_equal_log_softmaxs():
    torch.manual_seed(0)
    h, head = torch.randn(3, 10, 12, requires_grad=True), nn.Linear(12, 40)
    y = torch.randint(0, 40, (3, 10)); y[:, :2] = -100
    w = torch.randn(3, 10)
    res = []
    for f in (lambda: torch.where(y != -100, head(h).log_softmax(-1).gather(-1, y.clamp(min=0)[..., None])[..., 0], 0.), lambda: chunked_logprobs(h, head, y, chunk=7)):
        h.grad = None; head.zero_grad()
        lp = f(); (lp * w).sum().backward()
        res.append((lp.detach(), h.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()))
    for a, b in zip(*res): assert torch.allclose(a, b, atol=1e-6)

def test_a_per_token_loss_of_the_logits_takes_extras_row_by_row():
    torch.manual_seed(0)
    h, head, y, s = torch.randn(2, 6, 8, requires_grad=True), nn.Linear(8, 20), torch.randint(0, 20, (2, 6)), torch.rand(2, 6)
    y[1, :3] = -100
    got = chunked_token_loss(h, head, y, lambda z, y, s: (torch.logsumexp(z, -1) - z.gather(1, y.clamp(min=0)[:, None])[:, 0]) * s, s, chunk=4)
    want = (F.cross_entropy(head(h).flatten(0, 1), y.flatten(), reduction='none') * s.flatten()).sum()
    assert torch.allclose(got, want, atol=1e-5)

def test_a_batch_without_a_label_gives_zero_connected_to_every_parameter():
    "The loss is 0, and every parameter of the model gets a gradient of zeros, not none (DDP would wait for the missing ones)"
    model = tiny_gpt()
    ids = torch.randint(0, 50, (2, 8))
    for recompute in (False, True):
        model.zero_grad(set_to_none=True)
        with hidden_states(model) as head: h = model(ids)
        loss = chunked_lm_loss(h, head, torch.full((2, 8), -100), recompute=recompute)
        loss.backward()
        assert loss.item() == 0 and all(p.grad is not None and not p.grad.any() for p in model.parameters())

def test_what_the_backward_pass_keeps():
    "The plain loss keeps its log_softmax (positions x vocabulary); the chunked one a weight-sized gradient, or nothing but its inputs"
    torch.manual_seed(0)
    h, head, y = torch.randn(2, 256, 32, requires_grad=True), nn.Linear(32, 4096, bias=False), torch.randint(0, 4096, (2, 256))
    def kept(f):
        seen, have = {}, {t.untyped_storage().data_ptr() for t in (h, head.weight, y)}
        def pack(t):
            if (p := t.untyped_storage().data_ptr()) not in have: seen[p] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t): loss = f()
        loss.backward()
        return sum(seen.values())
    plain, fused, rec = kept(lambda: lm_loss(head(h), y)), kept(lambda: chunked_lm_loss(h, head, y)), kept(lambda: chunked_lm_loss(h, head, y, recompute=True))
    assert plain >= 512 * 4096 * 4 and fused <= (4096 * 32 + 512 * 32) * 4 + 8192 and rec <= 512 * 32 * 4 + 8192, (plain, fused, rec)  # (+ the rows' labels)

# ------------------------------------------------------------------ the callback
def _lm_batches(n=3, bs=3, T=12, V=50, seed=0, aligned=False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, V, (bs, T + 1), generator=g)
        labels = ids[:, 1:].clone(); labels[:, :4] = -100
        if aligned: out.append({'input_ids': ids[:, 1:], 'labels': torch.cat([torch.full((bs, 1), -100), labels[:, :-1]], 1)})
        else: out.append({'input_ids': ids[:, :-1], 'labels': labels})
    return out

def _run(cb, model, batches, loss_func=lm_loss, *cbs):
    rec = Record()
    t = Trainer(DataLoaders(batches, batches[:1]), loss_func, torch.optim.SGD, model, callbacks=[cb, MetricsCB(show=False), rec, *cbs])
    t.fit(1, lr=0.5)
    return rec, torch.cat([p.detach().flatten() for p in model.parameters()]), t

def _tiny_hf(kind):
    transformers = pytest.importorskip('transformers')
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == 'gpt2':
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                                                    resid_pdrop=0., embd_pdrop=0., attn_pdrop=0.))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16))

@pytest.mark.parametrize('kind', ['gpt', 'gpt2', 'llama', 'lora'])
def test_the_callback_trains_as_basictraincb(kind):
    "Losses, gradient norms and weights after 3 SGD steps equal BasicTrainCB's: aisaac's GPT (lm_loss), transformers' models (their own loss, labels aligned), LoRA"
    if kind == 'gpt': make, loss_func, batches = tiny_gpt, lm_loss, _lm_batches()
    elif kind == 'lora':
        from aisaac.hf import lora
        make, loss_func, batches = (lambda: lora(tiny_gpt(), r=4, verbose=False)), lm_loss, _lm_batches()
    else: make, loss_func, batches = (lambda: _tiny_hf(kind)), None, _lm_batches(aligned=True)
    a, wa, _ = _run(BasicTrainCB(), make(), batches, loss_func)
    b, wb, _ = _run(ChunkedLossCB(chunk=8), make(), batches, loss_func)
    assert a.losses == pytest.approx(b.losses, rel=1e-6) and a.norms == pytest.approx(b.norms, rel=1e-5)
    assert torch.allclose(wa, wb, atol=1e-6)

def test_the_hidden_states_and_the_logits_are_back_to_normal_outside_the_step():
    model = tiny_gpt()
    _run(ChunkedLossCB(), model, _lm_batches())
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 50) and 'forward' not in output_layer(model).__dict__

@pytest.mark.parametrize('how', ['accumulation', 'micro-batches'])
def test_token_weighted_accumulation_and_micro_batches_equal_one_big_batch(how):
    "4 micro-batches of different token counts (one masked throughout): the step of one batch of all their tokens"
    batches = chunked_batches()
    big = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    ref = fit(tiny_gpt(), [big], [ChunkedLossCB(chunk=8)], 1)
    model = tiny_gpt()
    if how == 'accumulation': got = fit(model, batches, [ChunkedLossCB(chunk=8)], 4)
    else: got = fit(model, [big], [ChunkedLossCB(chunk=8), MicroBatchCB(4)], 1)
    assert got.norms == pytest.approx(ref.norms, rel=1e-5)
    m_ref = tiny_gpt(); fit(m_ref, [big], [ChunkedLossCB(chunk=8)], 1)
    assert torch.allclose(torch.tensor(weights(model)), torch.tensor(weights(m_ref)), atol=1e-6)

TORCHRUN_CASES = HERE/'posttrain_run.py', {'chunked': ['chunked']}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/posttrain_run.py, run in one torchrun launch with the other cases the selected tests use (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

@torchrun_cases.uses('chunked')
def test_two_processes_equal_one_even_with_a_micro_batch_masked_throughout(cases):
    "2 processes (torchrun, gloo, DDP), 2 micro-batches each, rank 1's first masked throughout: no wait, and the step of one process on all 4"
    res = cases('chunked')
    model = tiny_gpt()
    one = fit(model, chunked_batches(), [ChunkedLossCB(chunk=8)], 4)
    for r in res:
        assert r['norms'] == pytest.approx(one.norms, rel=1e-5)
        assert torch.allclose(torch.tensor(r['weights']), torch.tensor(weights(model)), atol=1e-6)
    assert res[1]['losses'][0] == 0 and res[0]['losses'] + res[1]['losses'] == pytest.approx(one.losses, rel=1e-6)

def test_a_resumed_run_is_exact(tmp_path):
    "A shuffled loader of 6 batches, a checkpoint after the 4th: the resumed run ends with the uninterrupted one's weights, bit for bit"
    from aisaac.data import TensorLoader
    b = _lm_batches(n=6)
    ids, labels = torch.cat([x['input_ids'] for x in b]), torch.cat([x['labels'] for x in b])
    dl = lambda: TensorLoader(ids, labels, bs=3, shuffle=True, seed=0, tfm=lambda t: {'input_ids': t[0], 'labels': t[1]})
    def make(): return Trainer(DataLoaders(dl(), dl()), lm_loss, torch.optim.AdamW, tiny_gpt(), callbacks=[ChunkedLossCB(chunk=8)])
    straight = make(); straight.fit(2, callbacks=[CheckpointCB(tmp_path, every_n_batches=4, keep_last=None)])
    inside = checkpoints(tmp_path)[0]  # after batch 4 of the first epoch's 6
    resumed = make(); resumed.fit(2, resume_from=inside)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()): assert torch.equal(a, b)

def test_refusals_name_the_problem():
    batches = _lm_batches()
    def fit_with(cbs, loss_func=lm_loss, model=None):
        Trainer(DataLoaders(batches, batches[:1]), loss_func, torch.optim.SGD, model or tiny_gpt(), callbacks=cbs).fit(1)
    with pytest.raises(ValueError, match='computes the language model.s cross-entropy itself'): fit_with([ChunkedLossCB()], nn.MSELoss())
    from torcheval.metrics import Mean
    with pytest.raises(ValueError, match="MetricsCB's metrics \\['Mean'\\] read `trainer.preds`"): fit_with([ChunkedLossCB(), MetricsCB(Mean())])
    with pytest.raises(TypeError, match='has no output layer under `get_output_embeddings'): fit_with([ChunkedLossCB()], model=nn.Linear(3, 3))

def test_a_sharded_model_is_refused_with_the_reason(monkeypatch):
    "Under FSDP the output layer's weight is only this process's shard once the forward pass is over: the chunked losses refuse, naming it"
    import aisaac.callbacks.chunked as cc
    monkeypatch.setattr(cc, 'is_sharded', lambda m: True)
    batches = _lm_batches()
    with pytest.raises(ValueError, match='under FSDP each process then holds only its shard'):
        Trainer(DataLoaders(batches, batches[:1]), lm_loss, torch.optim.SGD, tiny_gpt(), callbacks=[ChunkedLossCB()]).fit(1)
