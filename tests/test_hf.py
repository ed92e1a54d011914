"""Hugging Face interop (`aisaac.hf`): LoRA through peft (only the adapters train, saved, loaded, merged, resumed exactly),
Hugging Face models saved and reloaded after a fit and after a resume, and aisaac's GPT exported to a transformers GPT-2
with the same logits (and back)."""
import sys, types
import pytest, torch
import torch.nn.functional as F

transformers = pytest.importorskip('transformers')
peft = pytest.importorskip('peft')
from aisaac.hf import lora, trainable_parameters, gpt2_config, gpt_to_hf, hf_to_gpt, hf_tokenizer, save_pretrained, GPT_LORA_TARGETS
from aisaac.models import GPT
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.savers import CheckpointCB
from aisaac.callbacks.samples import SampleCB
from test_language import lm_batches, hf_batches, V, T

class Chars:
    "A character tokenizer within the vocabulary"
    def encode(self, text): return [ord(c) % V for c in text]
    def decode(self, ids): return ''.join(chr(65 + i % 26) for i in ids)

def jiggled_gpt(seed=0, vocab_size=V):
    "A small GPT whose every weight is moved off its initial value (biases and layer norms too): a mixed-up weight would show"
    torch.manual_seed(seed)
    g = GPT(vocab_size, n_layer=2, n_head=2, d_model=32, block_size=T + 1)
    with torch.no_grad():
        for p in g.parameters(): p.add_(torch.randn_like(p) * 0.1)
    return g.eval()

def ids(n=3, seed=1): return torch.randint(0, V, (n, T + 1), generator=torch.Generator().manual_seed(seed))

def gpt_trainer(model, cbs=(), n=8):
    "aisaac's GPT on `lm_batches` (labels: the next tokens), its own `lm_loss`"
    dls = types.SimpleNamespace(train=lm_batches(n, 4), valid=lm_batches(2, 4, seed=1))
    return Trainer(dls, lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten()), torch.optim.AdamW, model,
                   callbacks=[BasicTrainCB(input_keys='input_ids', target_key='labels'), MetricsCB(show=False), *cbs])

def hf_gpt2(seed=0):
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_positions=T + 1, n_embd=32, n_layer=2, n_head=2,
                                                                bos_token_id=0, eos_token_id=0))

def hf_trainer(model, cbs=(), n=8):
    "A transformers model on `hf_batches`, with its own loss"
    dls = types.SimpleNamespace(train=hf_batches(n, 4), valid=hf_batches(2, 4, seed=1))
    return Trainer(dls, None, torch.optim.AdamW, model, callbacks=[BasicTrainCB(), *cbs])

def step_10(d):
    "The checkpoint of step 10 in `d`"
    ckpt = sorted(d.glob('checkpoint_*.pt'))[-1]
    assert torch.load(ckpt, weights_only=True)['clock']['step'] == 10, ckpt
    return ckpt

def same(a, b): return all(torch.equal(x, y) for x, y in zip(a.values(), b.values())) and list(a) == list(b)

# ------------------------------------------------------------------------------------------------ GPT <-> GPT-2
def test_gpt_exported_to_gpt2_gives_the_same_logits_and_comes_back_bit_identical():
    g = jiggled_gpt()
    hf = gpt_to_hf(g)
    assert isinstance(hf, transformers.GPT2LMHeadModel) and not hf.training
    c = hf.config
    assert (c.activation_function, c.n_embd, c.n_layer, c.n_head, c.n_inner, c.n_positions, c.vocab_size, c.tie_word_embeddings) == ('gelu', 32, 2, 2, 128, T + 1, V, True)
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied, as GPT's head
    x = ids()
    with torch.no_grad(): torch.testing.assert_close(hf(x).logits, g(x), atol=1e-5, rtol=1e-5)
    assert same(hf_to_gpt(hf).state_dict(), g.state_dict())
    b = gpt_to_hf(g.to(torch.bfloat16))  # the model's dtype (and device) carried across
    assert b.transformer.h[0].attn.c_attn.weight.dtype == torch.bfloat16 and torch.equal(b.transformer.h[0].attn.c_attn.weight, g.blocks[0].attn.qkv.weight.t())
    assert hf_to_gpt(b).tok_emb.weight.dtype == torch.bfloat16

def test_a_design_gpt_cannot_hold_is_refused():
    hf = gpt_to_hf(jiggled_gpt())
    hf.config.activation_function = 'gelu_new'  # OpenAI's GPT-2
    with pytest.raises(ValueError, match=r"activation_function is 'gelu_new' \(GPT: 'gelu'\)"): hf_to_gpt(hf)
    with pytest.raises(TypeError, match="gpt_to_hf converts aisaac's `GPT`"): gpt_to_hf(hf)

def test_a_gpt2_with_another_layer_norm_epsilon_converts_with_its_epsilon_and_back():
    "hf_to_gpt ignored `layer_norm_epsilon`: a GPT-2 with 0.1 came back as a GPT with torch's 1e-5, logits up to 0.916 apart"
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_positions=T + 1, n_embd=32, n_layer=2, n_head=2, activation_function='gelu',
                                                              layer_norm_epsilon=0.1, bos_token_id=0, eos_token_id=0)).eval()
    with torch.no_grad():
        for p in hf.parameters(): p.add_(torch.randn_like(p) * 0.1)
    g, x = hf_to_gpt(hf), ids()
    with torch.no_grad(): torch.testing.assert_close(g(x), hf(x).logits, atol=1e-5, rtol=1e-5)
    assert {m.eps for m in g.modules() if isinstance(m, torch.nn.LayerNorm)} == {0.1}
    back = gpt_to_hf(g)
    assert back.config.layer_norm_epsilon == 0.1
    with torch.no_grad(): torch.testing.assert_close(back(x).logits, hf(x).logits, atol=1e-5, rtol=1e-5)
    g.blocks[0].ln1.eps = 1e-5  # layer norms of several epsilons: GPT-2 has one
    with pytest.raises(ValueError, match=r"one `layer_norm_epsilon`.*1e-05.*0\.1"): gpt_to_hf(g)

def test_gpt_saved_as_gpt2_with_its_tokenizer_loads_with_from_pretrained(tmp_path):
    pytest.importorskip('tokenizers')
    from aisaac.text import train_tokenizer, EOT
    tok = train_tokenizer(['the cat sat on the mat', 'a dog ran in the park'] * 20, vocab_size=280, cache=False)
    g = jiggled_gpt(vocab_size=tok.get_vocab_size())
    save_pretrained(g, tmp_path, tokenizer=tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(hf) is transformers.GPT2LMHeadModel and hf.config.eos_token_id == tok.token_to_id(EOT)
    x = torch.randint(0, tok.get_vocab_size(), (2, 9))
    with torch.no_grad(): torch.testing.assert_close(hf(x).logits, g(x), atol=1e-5, rtol=1e-5)
    t2 = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = 'the dog sat in the park'
    assert t2(text)['input_ids'] == tok.encode(text).ids and t2.eos_token == EOT and t2.decode(tok.encode(text).ids) == text
    assert hf_tokenizer(t2) is t2
    assert same(hf_to_gpt(tmp_path).state_dict(), g.state_dict())  # back from the folder, bit for bit
    with pytest.raises(TypeError, match='save_pretrained saves transformers models'): save_pretrained(torch.nn.Linear(2, 2), tmp_path)

# ------------------------------------------------------------------------------------------------ HF models after a fit, after a resume
def test_a_hugging_face_model_trained_and_resumed_saves_and_reloads_with_the_same_logits(tmp_path):
    straight = hf_trainer(hf_gpt2())
    straight.fit(steps=12, valid_every=4, lr=3e-3)
    first = hf_trainer(hf_gpt2(), [CheckpointCB(tmp_path/'ckpt', every='5 steps', every_n_epochs=None)])
    first.fit(steps=12, valid_every=4, lr=3e-3)  # checkpoints at steps 5 and 10
    resumed = hf_trainer(hf_gpt2(seed=1))  # other initial weights: the checkpoint's must win
    resumed.fit(steps=12, valid_every=4, lr=3e-3, resume_from=step_10(tmp_path/'ckpt'))
    assert same(resumed.model.state_dict(), straight.model.state_dict())
    for name, t in (('straight', straight), ('resumed', resumed)):
        save_pretrained(t.model, tmp_path/name)
        back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path/name)
        t.model.eval(); x = ids()
        with torch.no_grad(): assert torch.equal(back(x).logits, t.model(x).logits)

# ------------------------------------------------------------------------------------------------ LoRA
def test_lora_on_gpt_trains_only_the_adapters(tmp_path, capsys):
    g = jiggled_gpt()
    base = {k: v.clone() for k, v in g.state_dict().items()}
    m = lora(g, r=4, alpha=8)
    d, r = 32, 4
    assert trainable_parameters(m)[0] == 2 * r * ((d + 3 * d) + (d + d) + (d + 4 * d) + (4 * d + d))  # A: r x in, B: out x r, per layer
    assert f'{trainable_parameters(m)[0]:,} trainable parameters' in capsys.readouterr().out
    names = {n for n, _ in m.named_modules() if n.endswith(tuple(GPT_LORA_TARGETS))}
    assert {n.split('base_model.model.')[1] for n in names if n.count('.') == 5} == {f'blocks.{i}.{t}' for i in range(2) for t in ('attn.qkv', 'attn.proj', 'mlp.0', 'mlp.2')}
    adapters = {k: v.clone() for k, v in m.named_parameters() if v.requires_grad}
    t = gpt_trainer(m, [sm := SampleCB('abc', Chars(), every='4 steps', max_new_tokens=3)]); t.model.train()
    t.fit(2, lr=1e-2)
    assert [s for s, _ in sm.samples] == [4, 8, 12, 16] and all(len(text) == 3 for _, text in sm.samples)  # GPT's generate, through peft
    now = {k.replace('base_model.model.', '').replace('.base_layer', ''): v for k, v in m.state_dict().items() if 'lora_' not in k}
    assert set(now) == set(base) and all(torch.equal(now[k], base[k]) for k in base)  # every base weight bit-identical
    assert all(not torch.equal(v, adapters[k]) for k, v in m.named_parameters() if 'lora_B' in k)  # (B starts at 0: it moved)
    assert t.history.get_metric_values('train_loss')[-1] < t.history.get_metric_values('train_loss')[0]

def test_lora_adapters_save_load_and_merge_with_the_same_logits(tmp_path):
    m = lora(jiggled_gpt(), verbose=False)
    gpt_trainer(m).fit(1, lr=1e-2)
    m.eval(); x = ids()
    with torch.no_grad(): want = m(x)
    m.save_pretrained(tmp_path/'adapters')  # peft's own: adapter_config.json and adapter_model.safetensors
    assert {p.name for p in (tmp_path/'adapters').iterdir()} == {'adapter_config.json', 'adapter_model.safetensors', 'README.md'}
    loaded = peft.PeftModel.from_pretrained(jiggled_gpt(), tmp_path/'adapters')  # on a fresh copy of the base model
    with torch.no_grad(): assert torch.equal(loaded(x), want)
    merged = save_pretrained(m, tmp_path/'merged', merge=True)  # merged into a copy, saved as GPT-2
    hf = transformers.GPT2LMHeadModel.from_pretrained(merged)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(m(x), want)  # the LoRA model itself was not merged
        plain = m.merge_and_unload()
        assert isinstance(plain, GPT)
        torch.testing.assert_close(plain(x), want, atol=1e-5, rtol=1e-5)

def test_lora_on_a_hugging_face_model_adapts_attention_and_mlp_and_leaves_the_rest(tmp_path):
    hf = hf_gpt2()
    base = {k: v.clone() for k, v in hf.state_dict().items()}
    m = lora(hf, r=4, verbose=False)
    adapted = {n.split('.lora_A')[0].split('transformer.')[1] for n, _ in m.named_parameters() if 'lora_A' in n}
    assert adapted == {f'h.{i}.{p}' for i in range(2) for p in ('attn.c_attn', 'attn.c_proj', 'mlp.c_fc', 'mlp.c_proj')}  # not lm_head
    hf_trainer(m).fit(1, lr=1e-2)
    now = {k.replace('base_model.model.', '').replace('.base_layer', ''): v for k, v in m.state_dict().items() if 'lora_' not in k}
    assert all(torch.equal(now[k], base[k]) for k in base)
    save_pretrained(m, tmp_path)  # the adapters, peft's format
    loaded = peft.PeftModel.from_pretrained(hf_gpt2(), tmp_path)
    m.eval(); loaded.eval(); x = ids()
    with torch.no_grad(): assert torch.equal(loaded(input_ids=x).logits, m(input_ids=x).logits)

def test_a_lora_fit_resumes_exactly(tmp_path):
    straight = gpt_trainer(lora(jiggled_gpt(), verbose=False))
    straight.fit(steps=12, valid_every=4, lr=1e-2)
    first = gpt_trainer(lora(jiggled_gpt(), verbose=False), [CheckpointCB(tmp_path, every='5 steps', every_n_epochs=None)])
    first.fit(steps=12, valid_every=4, lr=1e-2)
    resumed = gpt_trainer(lora(jiggled_gpt(), verbose=False))
    resumed.fit(steps=12, valid_every=4, lr=1e-2, resume_from=step_10(tmp_path))
    assert same(resumed.model.state_dict(), straight.model.state_dict())
    assert resumed.history.get_metric_values('train_loss') == straight.history.get_metric_values('train_loss')

def test_a_missing_peft_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, 'peft', None)
    with pytest.raises(ImportError, match=r'lora needs the `peft` package: pip install "aisaac\[peft\]"'): lora(jiggled_gpt())
