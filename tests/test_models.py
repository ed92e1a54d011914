"The models: shapes, parameter counts, where biases go, and the activations' values; the GPT's attention, loss, sampling and training."
from functools import partial
import math
import pytest, torch
import torch.nn.functional as F
from torch import nn

from aisaac.models import conv, get_model_conv, get_model, GeneralRelu, act_gr, ResBlock, get_model_resnet
from aisaac.models import get_model_gpt, GPT, CausalSelfAttention, lm_loss, sample_next

def n_params(m): return sum(p.numel() for p in m.parameters())

@pytest.mark.parametrize('size,ks,stride,out', [(28, 3, 2, 14), (7, 3, 2, 4), (28, 5, 1, 28), (28, 1, 1, 28), (2, 3, 2, 1)])
def test_conv_shapes(size, ks, stride, out):
    assert conv(3, 5, ks=ks, stride=stride)(torch.randn(2, 3, size, size)).shape == (2, 5, out, out)

@pytest.mark.parametrize('norm,has_bias', [(None, True), (nn.BatchNorm2d, False), (partial(nn.BatchNorm2d, momentum=0.2), False),
                                           (partial(nn.InstanceNorm2d, affine=True), False), (partial(nn.GroupNorm, 2), True)])
def test_conv_bias_only_without_batchnorm(norm, has_bias):
    "A batchnorm or instance norm subtracts each channel's mean, so the bias goes; a group norm does not, so it stays"
    assert (conv(4, 8, norm=norm)[0].bias is not None) == has_bias
    assert conv(4, 8, norm=norm, bias=False)[0].bias is None

def test_conv_layers_and_explicit_bias():
    assert [type(m) for m in conv(1, 8, act=None)] == [nn.Conv2d]
    assert [type(m) for m in conv(1, 8, act=nn.SiLU, norm=nn.BatchNorm2d)] == [nn.Conv2d, nn.BatchNorm2d, nn.SiLU]
    assert conv(1, 8, norm=nn.BatchNorm2d, bias=True)[0].bias.shape == (8,)
    assert conv(1, 8, bias=False)[0].bias is None
    assert conv(1, 8, norm=False)[0].bias is not None  # AIsaac passes `norm=False` for "none"

def test_conv_takes_aisaacs_kernel_size_keyword():
    "AIsaac's `conv(ni, nf, kernel_size=3, ...)`: the same layer as `ks=`, padded to keep the size at stride 1"
    c = conv(8, 8, kernel_size=5, stride=1)
    assert c[0].kernel_size == (5, 5) and c[0].padding == (2, 2)
    assert c(torch.randn(2, 8, 28, 28)).shape == (2, 8, 28, 28)
    assert conv(8, 8, 5)[0].kernel_size == (5, 5)  # positionally, the third argument in both libraries

def test_conv_bias_gets_no_gradient_under_batchnorm():
    torch.manual_seed(0)
    c = conv(2, 4, norm=nn.BatchNorm2d, bias=True)
    c(torch.randn(8, 2, 10, 10)).pow(2).sum().backward()
    assert c[0].bias.grad.abs().max() < 1e-4 * c[0].weight.grad.abs().max()

def test_get_model_conv_default_architecture_unchanged():
    "`get_model_conv()` is the same net as before issue 11: the tutorials, benchmarks and the demo call it without arguments"
    m = get_model_conv()
    convs = [l for l in m.modules() if isinstance(l, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding) for c in convs] == \
           [(a, b, (3, 3), (2, 2), (1, 1)) for a, b in [(1, 8), (8, 16), (16, 32), (32, 64), (64, 10)]]
    assert all(c.bias is not None for c in convs)
    assert sum(isinstance(l, nn.ReLU) for l in m.modules()) == 4
    assert n_params(m) == 30_154
    assert m(torch.randn(3, 1, 28, 28)).shape == (3, 10)

def test_get_model_conv_aisaac_argument_order():
    m = get_model_conv(nn.LeakyReLU, [1, 4, 8, 16, 32], nn.BatchNorm2d)
    assert sum(isinstance(l, nn.LeakyReLU) for l in m.modules()) == 4
    assert sum(isinstance(l, nn.BatchNorm2d) for l in m.modules()) == 4
    nfs = (1, 4, 8, 16, 32)
    assert n_params(m) == sum(a*b*9 + 2*b for a, b in zip(nfs, nfs[1:])) + 32*10*9 + 10
    assert [l[0].bias is None for l in m[:5]] == [True]*4 + [False]
    assert m(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert get_model_conv(n_out=3)(torch.randn(2, 1, 28, 28)).shape == (2, 3)
    assert get_model is get_model_conv  # miniai's name

def test_general_relu_values():
    x = torch.tensor([-10., -1., 0., 0.5, 5.])
    assert torch.equal(GeneralRelu()(x), F.relu(x))
    torch.testing.assert_close(GeneralRelu(leak=0.1)(x), torch.tensor([-1., -0.1, 0., 0.5, 5.]))
    torch.testing.assert_close(GeneralRelu(sub=0.4)(x), torch.tensor([-0.4, -0.4, -0.4, 0.1, 4.6]))
    torch.testing.assert_close(GeneralRelu(maxv=1.)(x), torch.tensor([0., 0., 0., 0.5, 1.]))
    torch.testing.assert_close(act_gr(maxv=3.)(x), torch.tensor([-1.4, -0.5, -0.4, 0.1, 3.]))
    assert act_gr(leak=0.2).leak == 0.2 and act_gr().sub == 0.4

def test_general_relu_leaves_its_input_alone_and_passes_gradients():
    x = torch.tensor([-1., 2.], requires_grad=True)
    y = GeneralRelu(leak=0.1, sub=0.4, maxv=1.)(x)
    assert torch.equal(x.detach(), torch.tensor([-1., 2.]))
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([0.1, 0.]))  # 2 is clamped: no gradient

def test_resblock_identity_and_projection():
    torch.manual_seed(0)
    same = ResBlock(6, 6, act=nn.ReLU)
    assert isinstance(same.idconv, nn.Identity) and isinstance(same.pool, nn.Identity)
    with torch.no_grad():
        for m in same.convs: m[0].weight.zero_(); m[0].bias.zero_()
    x = torch.randn(2, 6, 9, 9)
    assert torch.equal(same(x), F.relu(x))
    down = ResBlock(6, 12, stride=2)
    assert down(torch.randn(2, 6, 28, 28)).shape == (2, 12, 14, 14)
    assert down(x).shape == (2, 12, 5, 5)
    assert down.idconv[0].kernel_size == (1, 1)

def test_resblock_batchnorm_drops_conv_biases():
    rb = ResBlock(4, 8, stride=2, norm=nn.BatchNorm2d)
    assert [m[0].bias for m in rb.convs] == [None, None]
    assert [type(m) for m in rb.convs[0]] == [nn.Conv2d, nn.BatchNorm2d, GeneralRelu]

def test_get_model_resnet():
    torch.manual_seed(0)
    m = get_model_resnet()
    assert m(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    assert sum(isinstance(l, ResBlock) for l in m) == 6
    assert m[-2].bias is None and isinstance(m[-1], nn.BatchNorm1d)
    assert n_params(m) == 1_227_900
    small = get_model_resnet(act_gr, nfs=(4, 8, 8, 16, 16, 32), n_in=3, n_out=5)
    assert small(torch.randn(2, 3, 28, 28)).shape == (2, 5)
    with pytest.raises(RuntimeError):  # too few blocks for 28x28: the linear layer says the shapes disagree
        get_model_resnet(nfs=(8, 16, 32))(torch.randn(2, 1, 28, 28))

# ---------------------------------------------------------------- the GPT
def gpt(V=100, L=2, H=2, d=32, T=16, seed=0):
    torch.manual_seed(seed)
    return get_model_gpt(V, n_layer=L, n_head=H, d_model=d, block_size=T).eval()

def test_gpt_parameters_counted_by_hand_with_the_head_tied_to_the_embedding():
    V, L, d, T = 100, 2, 32, 16
    m = gpt(V, L, d=d, T=T)
    block = 2*d + (d*3*d + 3*d) + (d*d + d) + 2*d + (d*4*d + 4*d) + (4*d*d + d)  # ln1, qkv, proj, ln2, the MLP's two layers
    assert n_params(m) == V*d + T*d + L*block + 2*d  # no head: it is the token embedding
    assert m.head.weight is m.tok_emb.weight
    ids = torch.randint(0, V, (2, 8))
    lm_loss(m(ids[:, :-1]), ids[:, 1:]).backward()
    untied = gpt(V, L, d=d, T=T)  # the same weights, the head a copy: the tied weight's gradient is the sum of the two
    untied.head.weight = nn.Parameter(untied.tok_emb.weight.detach().clone())
    lm_loss(untied(ids[:, :-1]), ids[:, 1:]).backward()
    torch.testing.assert_close(m.tok_emb.weight.grad, untied.tok_emb.weight.grad + untied.head.weight.grad)
    m2 = gpt(V, L, d=d, T=T, seed=1)
    m2.load_state_dict(m.state_dict())  # a checkpoint keeps them tied
    assert m2.head.weight is m2.tok_emb.weight and torch.equal(m2.head.weight, m.tok_emb.weight)

def test_gpt_starts_with_gpt2s_initialisation():
    L = 4
    m = gpt(V=2048, L=L, H=4, d=128, T=128)
    assert abs(m.tok_emb.weight.std().item() - 0.02) < 0.0005 and abs(m.pos_emb.weight.std().item() - 0.02) < 0.001
    for b in m.blocks:
        assert abs(b.attn.qkv.weight.std().item() - 0.02) < 0.001 and abs(b.mlp[0].weight.std().item() - 0.02) < 0.001
        for w in (b.attn.proj.weight, b.mlp[2].weight):  # the layers writing into the residual stream: 0.02 / sqrt(2 * n_layer)
            assert abs(w.std().item() - 0.02 / math.sqrt(2 * L)) < 0.0005, w.std()
        assert (b.attn.qkv.bias == 0).all() and (b.mlp[2].bias == 0).all() and (b.ln1.weight == 1).all()

def attention_by_hand(a, x):
    "Multi-head attention with an explicit lower-triangular mask: the textbook formula"
    B, T, C = x.shape
    hd = C // a.n_head
    q, k, v = (t.view(B, T, a.n_head, hd).transpose(1, 2) for t in a.qkv(x).split(C, dim=2))
    w = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    w = w.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float('-inf')).softmax(-1)
    return a.proj((w @ v).transpose(1, 2).reshape(B, T, C))

def test_gpt_attention_is_the_masked_softmax_and_is_causal():
    torch.manual_seed(0)
    a, x = CausalSelfAttention(32, 4).eval(), torch.randn(3, 10, 32)
    torch.testing.assert_close(a(x), attention_by_hand(a, x), atol=1e-5, rtol=1e-5)
    m, ids = gpt(), torch.randint(0, 100, (2, 16))
    logits = m(ids)
    for t in (0, 5, 15):  # changing token t leaves every logit before t as it was, and changes those from t on
        ids2 = ids.clone(); ids2[:, t] = (ids2[:, t] + 1) % 100
        out = m(ids2)
        assert torch.equal(out[:, :t], logits[:, :t]) or torch.allclose(out[:, :t], logits[:, :t], atol=1e-6)
        assert (out[:, t:] - logits[:, t:]).abs().amax(-1).min() > 1e-5
    with pytest.raises(ValueError, match=r'`d_model` \(30\) must be a multiple of `n_head` \(4\)'): get_model_gpt(10, d_model=30, n_head=4)

def test_gpt_refuses_sequences_longer_than_block_size():
    m = gpt(T=16)
    assert m(torch.zeros(1, 16, dtype=torch.long)).shape == (1, 16, 100)
    with pytest.raises(ValueError, match=r'17 tokens, longer than its block_size of 16.*larger `block_size`'): m(torch.zeros(1, 17, dtype=torch.long))

def test_gpt_loss_with_labels_is_lm_loss_and_the_cross_entropy_by_hand():
    m, ids = gpt(), torch.randint(0, 100, (2, 17))
    x, y = ids[:, :-1], ids[:, 1:].clone()
    y[1, -4:] = -100  # positions without a next token are left out
    out = m(x, labels=y)
    assert torch.equal(out.logits, m(x)) and torch.equal(out.loss, lm_loss(out.logits, y))
    logp, keep = out.logits.log_softmax(-1), y != -100
    by_hand = -logp[keep].gather(-1, y[keep][:, None]).mean()  # mean over the 28 labelled positions, not the 32
    torch.testing.assert_close(out.loss, by_hand)
    assert abs(m(x, labels=ids[:, 1:]).loss.item() - math.log(100)) < 0.1  # small weights: about a uniform guess

def test_gpt_generate_length_determinism_and_greedy_by_hand():
    m, prompt = gpt(T=16), torch.randint(0, 100, (2, 10))
    torch.manual_seed(3); a = m.generate(prompt, 20, temperature=0.8, top_k=10)
    torch.manual_seed(3); b = m.generate(prompt, 20, temperature=0.8, top_k=10)
    torch.manual_seed(4); c = m.generate(prompt, 20, temperature=0.8, top_k=10)
    assert a.shape == (2, 30) and torch.equal(a[:, :10], prompt) and torch.equal(a, b) and not torch.equal(a, c)
    idx = prompt  # greedy, by hand: the likeliest next token of the last block_size tokens, 20 times (past block_size)
    for _ in range(20): idx = torch.cat([idx, m(idx[:, -16:])[:, -1].argmax(-1, keepdim=True)], 1)
    seen = []  # the context the model is given: the whole sequence, then its last block_size tokens
    hook = m.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[1]))
    assert torch.equal(m.generate(prompt, 20, temperature=0), idx)
    hook.remove()
    assert seen == [min(10 + i, 16) for i in range(20)]
    assert torch.equal(m.generate(prompt, 20, top_k=1), idx)  # top_k=1 leaves only the likeliest
    logits = torch.tensor([[0., 1., 2., 3.]]).repeat(2000, 1)
    torch.manual_seed(0); draws = sample_next(logits, top_k=2).flatten()
    assert set(draws.tolist()) == {2, 3} and abs((draws == 3).float().mean().item() - 1 / (1 + math.exp(-1))) < 0.03  # softmax of (2, 3)

PARAGRAPH = b"""It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness,
it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was the season of Darkness,
it was the spring of hope, it was the winter of despair, we had everything before us, we had nothing before us, we were
all going direct to Heaven, we were all going direct the other way."""

def test_gpt_learns_a_paragraph_in_a_few_hundred_steps_with_or_without_a_loss_function():
    "Bytes as tokens, every window of 33 bytes a block: the loss falls from log(256), and `loss_func=lm_loss` and the model's own loss (`loss_func=None`) train alike"
    from aisaac.data import DataLoaders, TensorLoader
    from aisaac.trainer import Trainer
    from aisaac.callbacks.train import BasicTrainCB
    from aisaac.callbacks.metrics import MetricsCB
    blocks = torch.tensor(list(PARAGRAPH)).unfold(0, 33, 1)
    def split(b): return {'input_ids': b[0][:, :-1], 'labels': b[0][:, 1:]}
    def fit(loss_func):
        dls = DataLoaders(TensorLoader(blocks, bs=32, shuffle=True, seed=0, tfm=split), TensorLoader(blocks[::8], bs=64, tfm=split))
        torch.manual_seed(0)
        m = get_model_gpt(256, n_layer=2, n_head=2, d_model=48, block_size=32)
        with torch.no_grad(): start = lm_loss(m(blocks[::8, :-1]), blocks[::8, 1:]).item()
        t = Trainer(dls, loss_func, torch.optim.AdamW, m, callbacks=[BasicTrainCB(), MetricsCB()])
        t.fit(steps=300, valid_every=150, lr=1e-3)
        assert t.clock.step == 300
        return [start, *t.history.get_metric_values('valid_loss')]
    losses = fit(lm_loss)
    assert abs(losses[0] - math.log(256)) < 0.1 and losses[2] < losses[1] < 3 and losses[2] < 1, losses
    assert fit(None) == pytest.approx(losses, rel=1e-4)

# ---------------------------------------------------------------- padding, packing, bad token ids, stopping, nucleus sampling
def test_gpt_packed_documents_see_only_themselves_and_restart_their_positions():
    "Three documents packed in one row with `position_ids` restarting at 0: each one's logits are those of the document alone"
    m = gpt(T=16)
    docs = [torch.randint(0, 100, (1, n)) for n in (5, 7, 4)]
    row = torch.cat(docs, 1)
    pos = torch.cat([torch.arange(d.shape[1]) for d in docs])[None]
    packed = m(row, position_ids=pos)
    alone = torch.cat([m(d) for d in docs], 1)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    assert (m(row) - alone)[:, 5:].abs().amax() > 1e-3  # without position_ids the documents see each other
    two = m(torch.cat([row, row.flip(1)]), position_ids=torch.cat([pos, pos.flip(1).sub(pos.flip(1)[:, -1:]).abs()]))  # a batch of rows, laid out differently
    torch.testing.assert_close(two[:1], packed, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r'position_ids.*\(1, 15\).*input_ids.*\(1, 16\)'): m(row, position_ids=pos[:, :-1])

def test_gpt_padded_rows_give_the_logits_of_the_unpadded_rows_on_real_positions():
    m = gpt(T=16)
    a, b = torch.randint(1, 100, (1, 16)), torch.randint(1, 100, (1, 9))
    batch = torch.cat([a, F.pad(b, (0, 7))])  # right padding with 0
    mask = torch.cat([torch.ones(1, 16), F.pad(torch.ones(1, 9), (0, 7))]).long()
    out = m(batch, attention_mask=mask)
    assert not out.isnan().any()
    torch.testing.assert_close(out[1:, :9], m(b), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:1], m(a), atol=1e-5, rtol=1e-5)
    assert (m(F.pad(b, (0, 7), value=5))[:, :9] - m(b)).abs().amax() < 1e-5  # right padding is not seen even without a mask (causal)
    left = m(F.pad(b, (7, 0)), attention_mask=F.pad(torch.ones(1, 9), (7, 0)).long())  # left padding: masked, positions from the first real token
    torch.testing.assert_close(left[:, 7:], m(b), atol=1e-5, rtol=1e-5)
    empty = m(torch.zeros(2, 16, dtype=torch.long), attention_mask=torch.zeros(2, 16, dtype=torch.long))  # rows of padding only: no NaN
    assert not empty.isnan().any()
    out = m(batch, labels=batch, attention_mask=mask)
    torch.testing.assert_close(out.logits, m(batch, attention_mask=mask))

def test_gpt_padding_and_packing_masks_combine():
    "A packed row that ends in padding: each document as alone, the padding seen by nobody"
    m = gpt(T=16)
    d1, d2 = torch.randint(1, 100, (1, 6)), torch.randint(1, 100, (1, 5))
    row, pos = F.pad(torch.cat([d1, d2], 1), (0, 5)), torch.cat([torch.arange(6), torch.arange(5), torch.zeros(5, dtype=torch.long)])[None]
    out = m(row, position_ids=pos, attention_mask=(torch.arange(16) < 11).long()[None])
    torch.testing.assert_close(out[:, :11], torch.cat([m(d1), m(d2)], 1), atol=1e-5, rtol=1e-5)
    assert not out.isnan().any()

def test_gpt_gradients_flow_only_within_each_document():
    m = gpt(T=16).train()
    row, pos = torch.randint(0, 100, (1, 12)), torch.cat([torch.arange(6), torch.arange(6)])[None]
    emb = m.tok_emb(row).detach().requires_grad_()
    m.tok_emb.forward = lambda ids: emb  # the gradient of the second document's loss with respect to each input position
    m(row, position_ids=pos)[:, 6:].sum().backward()
    assert emb.grad[:, :6].abs().amax() == 0 and emb.grad[:, 6:].abs().amax() > 0

@pytest.mark.parametrize('keys', [('input_ids', 'labels', 'attention_mask'), ('input_ids', 'labels', 'position_ids')])
@pytest.mark.parametrize('loss_func', [lm_loss, None])
def test_gpt_trains_on_padded_and_packed_dict_batches_without_input_keys(keys, loss_func):
    "The batches the text helpers make: BasicTrainCB passes `input_ids` and the mask or positions by name, or the whole batch when the model computes the loss"
    from aisaac.data import DataLoaders, TensorLoader
    from aisaac.trainer import Trainer
    from aisaac.callbacks.train import BasicTrainCB
    seen = []
    def batch(b):
        ids = b[0]
        d = {'input_ids': ids[:, :-1], 'labels': ids[:, 1:].clone()}
        if keys[2] == 'attention_mask':
            d['attention_mask'] = torch.ones_like(d['input_ids']); d['attention_mask'][::2, 10:] = 0; d['labels'][::2, 10:] = -100
        else: d['position_ids'] = torch.cat([torch.arange(8), torch.arange(8)]).expand_as(d['input_ids'])
        return d
    blocks = torch.randint(0, 50, (64, 17))
    torch.manual_seed(0)
    m = get_model_gpt(50, n_layer=1, n_head=2, d_model=16, block_size=16)
    m.register_forward_pre_hook(lambda mod, args, kw: seen.append(sorted(kw)), with_kwargs=True)
    dls = DataLoaders(TensorLoader(blocks, bs=16, tfm=batch), TensorLoader(blocks[:16], bs=16, tfm=batch))
    t = Trainer(dls, loss_func, torch.optim.AdamW, m, callbacks=[BasicTrainCB()])
    t.fit(steps=8, lr=1e-2, valid=False)
    assert t.clock.step == 8
    assert seen[0] == sorted(keys if loss_func is None else (keys[0], keys[2]))

def test_gpt_token_ids_the_model_cannot_embed_are_an_error_naming_both_sizes():
    m = gpt(V=100, T=16)
    with pytest.raises(ValueError, match=r'token id 250.*vocab_size of 100.*vocab_size=251'): m(torch.tensor([[1, 250, 3]]))
    with pytest.raises(ValueError, match=r'token id -100.*labels'): m(torch.tensor([[1, -100, 3]]))
    with pytest.raises(ValueError, match=r'position 16.*block_size of 16'): m(torch.tensor([[1, 2]]), position_ids=torch.tensor([[0, 16]]))
    assert m(torch.tensor([[0, 99]])).shape == (1, 2, 100)

def test_sample_next_top_p():
    logits = torch.tensor([[0., 1., 2., 3.]]).repeat(2000, 1)  # probabilities 0.03, 0.09, 0.24, 0.64
    torch.manual_seed(0); assert set(sample_next(logits, top_p=1e-6).flatten().tolist()) == {3}  # a tiny top_p is the argmax
    torch.manual_seed(0); draws = sample_next(logits, top_p=0.8).flatten()  # 0.64 < 0.8: the two likeliest (0.88) are kept
    assert set(draws.tolist()) == {2, 3} and abs((draws == 3).float().mean().item() - 1 / (1 + math.exp(-1))) < 0.03
    torch.manual_seed(0); assert set(sample_next(logits, top_p=1.0).flatten().tolist()) == {0, 1, 2, 3}
    torch.manual_seed(0); assert set(sample_next(logits, top_k=3, top_p=0.9).flatten().tolist()) == {2, 3}  # 0.64/0.97 < 0.9 < (0.64+0.24)/0.97
    m, prompt = gpt(T=16), torch.randint(0, 100, (2, 5))
    assert torch.equal(m.generate(prompt, 10, top_p=1e-6), m.generate(prompt, 10, temperature=0))
    with pytest.raises(ValueError, match=r'top_p.*1.5'): sample_next(logits, top_p=1.5)

def test_generate_stops_at_the_end_of_text_token():
    m, prompt = gpt(T=16), torch.randint(0, 100, (3, 4))
    greedy = m.generate(prompt, 12, temperature=0)
    eos = greedy[0, 6].item()  # the third token the first row generates
    out = m.generate(prompt, 12, temperature=0, eos_id=eos)
    for r in range(3):
        gen = greedy[r, 4:].tolist()
        n = gen.index(eos) + 1 if eos in gen else 12  # up to and including its first end-of-text token
        assert out[r, 4:4 + n].tolist() == gen[:n] and (out[r, 4 + n:] == eos).all()
    ends = [(greedy[r, 4:] == eos).nonzero() for r in range(3)]
    assert out.shape[1] == 4 + (max(e[0].item() + 1 for e in ends) if all(len(e) for e in ends) else 12)
    calls = []
    h = m.register_forward_pre_hook(lambda mod, args: calls.append(1))
    one = m.generate(prompt[:1], 12, temperature=0, eos_id=eos)
    h.remove()
    n0 = greedy[0, 4:].tolist().index(eos) + 1
    assert one.shape == (1, 4 + n0) and one[0, -1] == eos and len(calls) == n0  # all rows ended: no more forward passes
