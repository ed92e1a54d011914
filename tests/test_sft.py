"""Supervised fine-tuning data (aisaac.sft): masked prompts through a chat template or the plain format, cutting, padding, packing
that keeps documents apart (checked on `transformers` models), and the loaders' two label conventions."""
import inspect, re, warnings
import pytest, torch
from aisaac.data import DataNotFoundError
from aisaac.text import train_tokenizer, as_tokenizer, EOT
from aisaac.sft import (tokenize_chats, chat_segments, fit_examples, pad_examples, pack_examples, packed_attention_mask, SFTBatch,
                        SFTCollator, sft_dataloaders, wordnet_glosses)

tk = pytest.importorskip('tokenizers')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()
WORDS = ('cat dog tea bank run fast slow leaf tree water fire stone river cloud bird fish light dark cold warm green '
         'red blue small large old new high low open shut').split()

def qa(words, n=1): return [{'prompt': f'What does "{w}" mean?', 'response': ' '.join([f'{w} is a word'] * (1 + i % n))} for i, w in enumerate(words)]

@pytest.fixture(scope='module')
def tok():
    texts = [f"{e['prompt']} {e['response']}" for e in qa(WORDS * 3, 5)]
    return train_tokenizer(texts, vocab_size=300, cache=False)

@pytest.fixture(scope='module')
def chatml(tok):
    h = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT)
    h.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return h

def trained_text(t, ex): return as_tokenizer(t).decode([i for i, l in zip(ex['input_ids'], ex['labels']) if l != -100])

def test_only_the_replies_and_their_end_are_trained_in_the_plain_format_and_through_a_chat_template(tok, chatml):
    chat = [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'cat is a word'},
            {'role': 'user', 'content': 'and?'}, {'role': 'assistant', 'content': 'dog is a word'}]
    (plain,) = tokenize_chats([{'messages': chat}], tok)
    assert trained_text(tok, plain) == f'cat is a word{EOT}dog is a word{EOT}'
    assert as_tokenizer(tok).decode(plain['input_ids']) == f'User: hi\nAssistant: cat is a word{EOT}User: and?\nAssistant: dog is a word{EOT}'
    (tmpl,) = tokenize_chats([{'messages': chat}], chatml)
    assert trained_text(chatml, tmpl) == 'cat is a word<|im_end|>\ndog is a word<|im_end|>\n'
    assert as_tokenizer(chatml).decode(tmpl['input_ids']) == chatml.apply_chat_template(chat, tokenize=False)
    (pr,) = tokenize_chats([{'q': 'What?', 'a': 'tea'}], tok, prompt_col='q', response_col='a')
    assert trained_text(tok, pr) == f'tea{EOT}' and pr['labels'][0] == -100

def test_bad_examples_and_templates_are_refused_with_the_reason(tok, chatml):
    with pytest.raises(KeyError, match=r"this one has \['question', 'answer'\]"): tokenize_chats([{'question': 'q', 'answer': 'a'}], tok)
    with pytest.raises(ValueError, match="needs an 'assistant' message"): tokenize_chats([{'messages': [{'role': 'user', 'content': 'hi'}]}], tok)
    h = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT)
    h.chat_template = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"  # the count up front: no prefix
    with pytest.raises(ValueError, match='does not render a chat as the prefix'): chat_segments([{'role': 'user', 'content': 'a'}, {'role': 'assistant', 'content': 'b'}], h)

def test_too_long_examples_are_cut_dropped_or_refused_and_counted(tok):
    exs = tokenize_chats(qa(['cat', 'dog', 'tea'], 1) + [{'prompt': 'Long?', 'response': 'tree ' * 50}], tok)
    with pytest.warns(UserWarning, match=r'1 of 4 examples have more than 40 tokens: cut to their first 40'): cut = fit_examples(exs, 40)
    assert [len(e['input_ids']) for e in cut] == [len(e['input_ids']) for e in exs[:3]] + [40]
    with pytest.warns(UserWarning, match='1 left out'): assert len(fit_examples(exs, 40, 'drop')) == 3
    with pytest.raises(ValueError, match=r'1 example\(s\) have more than 40 tokens \(the first, #3'): fit_examples(exs, 40, 'error')
    with pytest.warns(UserWarning, match='4 left out with no reply token left'): assert fit_examples(exs, 4) == []
    with pytest.raises(ValueError, match="No example of the 'train' split is left"), warnings.catch_warnings():
        warnings.simplefilter('ignore'); sft_dataloaders({'train': qa(WORDS), 'valid': qa(WORDS)}, tok, block_size=3)

@pytest.mark.parametrize('hf', [False, True])
def test_padded_batches_mask_the_prompt_and_the_padding_in_both_conventions(tok, hf):
    exs = tokenize_chats(qa(['cat', 'water'], 3), tok)
    b = SFTCollator(tok, hf_labels=hf)(exs)
    n = [len(e['input_ids']) for e in exs]
    assert set(b) == {'input_ids', 'labels', 'attention_mask'} and b['input_ids'].dtype == b['labels'].dtype == torch.int64
    for i, e in enumerate(exs):
        k = n[i] - (not hf)  # the inputs of an example: all its tokens (hf), or all but the last (shifted)
        assert b['attention_mask'][i].sum() == k and b['input_ids'][i, :k].tolist() == e['input_ids'][:k]
        assert b['labels'][i, :k].tolist() == (e['labels'] if hf else e['labels'][1:])
        assert (b['labels'][i, k:] == -100).all() and (b['input_ids'][i, k:] == as_tokenizer(tok).pad_id).all()
    dl = torch.utils.data.DataLoader(exs * 3, batch_size=4, collate_fn=SFTCollator(tok, hf_labels=hf))
    assert [x['input_ids'].shape[0] for x in dl] == [4, 2]

def _docs(row_pos):
    "The (start, end) of each document of a row, from its position ids"
    starts = (row_pos == 0).nonzero().flatten().tolist() + [len(row_pos)]
    return list(zip(starts[:-1], starts[1:]))

@pytest.mark.parametrize('hf', [False, True])
def test_packing_restarts_positions_and_masks_every_document_boundary(tok, hf):
    data = {'train': qa(WORDS, 4), 'valid': qa(WORDS[:8], 4)}
    packed = sft_dataloaders(data, tok, block_size=96, bs=64, pack=True, hf_labels=hf, block_mask=False)
    padded = sft_dataloaders(data, tok, block_size=96, bs=64, hf_labels=hf)
    (p,) = list(packed.train.__class__(*packed.train.tensors, bs=64, tfm=packed.train.tfm))  # one batch, unshuffled
    assert set(p) == {'input_ids', 'labels', 'position_ids'} and p['input_ids'].shape[1] == 96
    assert len(p['input_ids']) < len(WORDS) / 2  # several examples per row
    ref = {tuple(e['input_ids']): e for e in tokenize_chats(data['train'], tok)}
    seen = 0
    for ids, labels, pos in zip(p['input_ids'], p['labels'], p['position_ids']):
        assert (pos[_docs(pos)[0][0]:] >= 0).all()
        for s, e in _docs(pos):
            assert pos[s:e].tolist() == list(range(e - s))
            if hf: assert labels[s] == -100  # the model shifts: the first token of a document is no target
            else: assert s == 0 or labels[s - 1] == -100  # shifted: the token before a document does not predict it
        for s, e in _docs(pos)[:-1]:  # the documents (the last may be the padding, or one cut at the row's end when shifted)
            seen += tuple(ids[s:e].tolist()) in ref
    assert seen >= len(WORDS) // 2
    n_trained = lambda dl: sum((b['labels'] != -100).sum().item() for b in dl)
    assert n_trained(packed.train) == n_trained(padded.train) == sum(sum(l != -100 for l in e['labels'][1:]) for e in ref.values())

def _tiny(kind, V):
    torch.manual_seed(0)
    if kind == 'gpt2':
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                                                    attn_implementation='sdpa', bos_token_id=0, eos_token_id=0)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                                  num_key_value_heads=2, max_position_embeddings=64, attn_implementation='sdpa',
                                                                  bos_token_id=0, eos_token_id=0, pad_token_id=0)).eval()

@pytest.mark.parametrize('kind', ['gpt2', 'llama'])
def test_a_transformers_model_sees_each_packed_document_as_if_it_were_alone(tok, kind):
    dls = sft_dataloaders({'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4, pack=True, hf_labels=True)
    b = next(iter(dls.valid))
    assert b['attention_mask'].shape == (4, 1, 64, 64) and b['attention_mask'].dtype == torch.float32  # additive: eager attention adds it
    m = _tiny(kind, as_tokenizer(tok).vocab_size)
    with torch.no_grad():
        out = m(**b)  # the 4-D mask, position_ids and labels as the loader gives them
        plain = m(input_ids=b['input_ids'], position_ids=b['position_ids']).logits  # position_ids alone
        n_docs = loss_sum = n_tok = 0
        for r in range(4):
            for s, e in _docs(b['position_ids'][r]):
                alone = m(input_ids=b['input_ids'][r:r+1, s:e], labels=b['labels'][r:r+1, s:e])
                torch.testing.assert_close(out.logits[r, s:e], alone.logits[0], atol=2e-5, rtol=1e-4)
                if (k := (b['labels'][r, s+1:e] != -100).sum().item()): loss_sum += alone.loss.item() * k; n_tok += k
                n_docs += 1
        assert n_docs > 4
        torch.testing.assert_close(out.loss.item(), loss_sum / n_tok, atol=1e-5, rtol=1e-5)  # the packed loss is the documents' loss
        # transformers v5 with SDPA does not separate documents from position_ids alone: the 4-D mask is needed (the docs say so)
        assert (plain - out.logits).abs().max() > 1e-3

def test_packed_attention_mask_is_block_diagonal_and_causal():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0]])
    m = packed_attention_mask(pos, torch.bool)[0, 0].int()
    assert m.tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1]]
    for dt in (torch.float32, torch.bfloat16):  # additive: 0 where a query may attend, the type's most negative value elsewhere
        f = packed_attention_mask(pos, dt)
        assert f.dtype == dt and torch.equal(f[0, 0] == 0, m.bool()) and (f[0, 0][m == 0] == torch.finfo(dt).min).all()

def test_the_loaders_take_any_split_names_and_state_the_fix(tok):
    from datasets import Dataset, DatasetDict
    dsd = DatasetDict(train=Dataset.from_list(qa(WORDS)), validation=Dataset.from_list(qa(WORDS[:5])))
    dls = sft_dataloaders(dsd, tok, block_size=64, bs=8)
    assert len(dls.valid.tensors[0]) == 5 and dls.tokenizer.pad_id == as_tokenizer(tok).pad_id
    with pytest.raises(KeyError, match=r"No split 'train': the splits are \['training', 'validation'\]"):
        sft_dataloaders(DatasetDict(training=dsd['train'], validation=dsd['validation']), tok)

def test_the_built_in_gpt_keeps_packed_documents_apart(tok):
    from aisaac.models import GPT, get_model_gpt
    if 'position_ids' not in inspect.signature(GPT.forward).parameters: pytest.skip("aisaac's GPT takes no `position_ids` yet (issue 28)")
    dls = sft_dataloaders({'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4, pack=True)
    b = next(iter(dls.valid))
    torch.manual_seed(0)
    m = get_model_gpt(as_tokenizer(tok).vocab_size, n_layer=2, n_head=2, d_model=32, block_size=64).eval()
    with torch.no_grad():
        out = m(b['input_ids'], position_ids=b['position_ids'])
        for r in range(4):
            for s, e in _docs(b['position_ids'][r]):
                torch.testing.assert_close(out[r, s:e], m(b['input_ids'][r:r+1, s:e])[0], atol=2e-5, rtol=1e-4)

def test_wordnet_is_an_instruction_set_split_by_word(tmp_path, monkeypatch):
    monkeypatch.setenv('AISAAC_WORDNET', str(tmp_path))
    with pytest.raises(DataNotFoundError, match='apt-get install wordnet-base'): wordnet_glosses()
    lines = {'noun': ['  1 licence text', '00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | that which is perceived; "an entity"  ',
                      '00002137 03 n 02 abstraction 0 abstract_entity 0 000 | a general concept  '],
             'verb': ['00001740 29 v 04 breathe 0 take_a_breath 0 respire 0 suspire 3 000 | draw air into, and expel out of, the lungs  '],
             'adj': ['00001740 00 a 01 able(a) 0 000 | having the necessary means  '], 'adv': ['00001837 02 r 01 barely 0 000 | only just  ']}
    for k, ls in lines.items(): (tmp_path/f'data.{k}').write_text('\n'.join(ls) + '\n')
    d = wordnet_glosses(valid_pct=0.4, seed=0)
    rows = list(d['train']) + list(d['valid'])
    assert len(rows) == 5 and len(d['valid']) == 2 and not set(d['train']['word']) & set(d['valid']['word'])
    assert {'prompt': 'What does the adjective "able" mean?', 'response': 'having the necessary means', 'word': 'able', 'pos': 'adjective'} in rows
    assert any(r['response'] == 'that which is perceived; "an entity"' and r['prompt'] == 'What does the noun "entity" mean?' for r in rows)

@pytest.mark.parametrize('pack', [False, True])
def test_a_transformers_gpt2_fine_tunes_on_padded_and_packed_batches_with_the_trainer(tok, pack):
    "The batches as the loaders give them go through `BasicTrainCB` to the model's own loss; the loss on the replies falls"
    from aisaac.trainer import Trainer
    from aisaac.callbacks.train import BasicTrainCB
    from aisaac.callbacks.metrics import MetricsCB
    data = {'train': qa(WORDS * 4, 3), 'valid': qa(WORDS[:8], 3)}
    dls = sft_dataloaders(data, tok, block_size=64, bs=8, pack=pack, hf_labels=True, seed=0)
    model = _tiny('gpt2', as_tokenizer(tok).vocab_size).train()
    t = Trainer(dls, None, torch.optim.AdamW, model, callbacks=[BasicTrainCB(), MetricsCB()])
    t.fit(3, lr=3e-3)
    first, last = t.history.get_metric_values('valid_loss')[0], t.history.get_metric_values('valid_loss')[-1]
    assert last < first - 0.5, (first, last)

def test_chat_prompt_is_what_the_training_example_holds_before_the_reply(tok, chatml):
    from aisaac.sft import chat_prompt
    chat = [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'cat is a word'}, {'role': 'user', 'content': 'and dog?'}]
    for t in (tok, chatml):
        (ex,) = tokenize_chats([{'messages': chat + [{'role': 'assistant', 'content': 'dog is a word'}]}], t)
        ids = chat_prompt(chat, t)
        assert ex['input_ids'][:len(ids)] == ids and ex['labels'][len(ids)] != -100 and ex['labels'][len(ids) - 1] == -100
    assert as_tokenizer(chatml).decode(chat_prompt('hi', chatml)) == '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n'

def test_tokenized_splits_are_taken_as_they_are(tok):
    data = {'train': qa(WORDS, 2), 'valid': qa(WORDS[:6], 2)}
    done = {k: tokenize_chats(v, tok) for k, v in data.items()}
    for pack in (False, True):
        a, b = sft_dataloaders(data, tok, block_size=64, pack=pack), sft_dataloaders(done, tok, block_size=64, pack=pack)
        for x, y in zip(a.valid.tensors, b.valid.tensors): assert torch.equal(x, y)

# ------------------------------------------------------------------------------------------------ issue 37: what clients found
def _tiny_impl(kind, V, impl):
    "A tiny transformers model with the attention implementation `impl` (one that cannot be built here is set on an sdpa one's config)"
    m = _tiny(kind, V)
    if impl != 'sdpa': m.config._attn_implementation = impl  # (what `from_pretrained(..., attn_implementation=impl)` sets)
    return m

def _fit(dls, model, loss_func=None, n=1):
    from aisaac.trainer import Trainer
    from aisaac.callbacks.train import BasicTrainCB
    t = Trainer(dls, loss_func, torch.optim.AdamW, model, callbacks=[BasicTrainCB()])
    t.fit(n, lr=1e-3)
    return t

@pytest.mark.parametrize('impl', ['eager', 'sdpa'])
@pytest.mark.parametrize('kind', ['gpt2', 'llama'])
def test_packed_documents_are_kept_apart_by_every_attention_the_mask_serves(tok, kind, impl):
    "eager attention adds the mask to the scores: a boolean one (True = 1) kept nothing apart (0.05 to 0.2 of a logit leaked)"
    dls = sft_dataloaders({'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4, pack=True, hf_labels=True)
    b = next(iter(dls.valid))
    m = _tiny_impl(kind, as_tokenizer(tok).vocab_size, impl)
    with torch.no_grad():
        out = m(**b).logits
        for r in range(4):
            for s, e in _docs(b['position_ids'][r]):
                torch.testing.assert_close(out[r, s:e], m(input_ids=b['input_ids'][r:r+1, s:e]).logits[0], atol=2e-5, rtol=1e-4)

@pytest.mark.parametrize('impl', ['flash_attention_2', 'flash_attention_3', 'kernels-community/flash-attn2', 'flex_attention', 'paged|sdpa'])
@pytest.mark.parametrize('kind', ['gpt2', 'llama'])
def test_an_attention_the_block_mask_cannot_serve_is_refused_with_what_to_use(tok, kind, impl):
    dls = sft_dataloaders({'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4, pack=True, hf_labels=True)
    m = _tiny_impl(kind, as_tokenizer(tok).vocab_size, impl)
    with pytest.raises(ValueError, match=rf"attention is '{impl}'.*attn_implementation='sdpa'"): dls.check_model(m)
    padded = sft_dataloaders({'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4, hf_labels=True)
    padded.check_model(m)  # padded batches carry a (B, T) mask, which any attention takes
    for ok in ('eager', 'sdpa'): dls.check_model(_tiny_impl(kind, as_tokenizer(tok).vocab_size, ok))  # served

def test_the_refusal_comes_when_the_fit_starts_before_any_batch_runs(tok):
    dls = sft_dataloaders({'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4, pack=True, hf_labels=True)
    m = _tiny_impl('llama', as_tokenizer(tok).vocab_size, 'flash_attention_2')
    calls = []
    m.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match="attention is 'flash_attention_2'"): _fit(dls, m)
    assert calls == []

def test_block_mask_with_aisaacs_gpt_is_refused_with_the_reason(tok):
    from aisaac.models import get_model_gpt, lm_loss
    dls = sft_dataloaders({'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4, pack=True, block_mask=True)
    gpt = get_model_gpt(as_tokenizer(tok).vocab_size, n_layer=1, n_head=2, d_model=16, block_size=64)
    with pytest.raises(ValueError, match=r"aisaac's GPT keeps packed documents apart from `position_ids`.*block_mask=False"): _fit(dls, gpt, lm_loss)
    _fit(sft_dataloaders({'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4, pack=True), gpt, lm_loss)  # the default: fine

@pytest.mark.parametrize('kind', ['gpt2', 'llama'])
def test_a_model_whose_vocabulary_is_smaller_than_the_tokenizers_is_refused_naming_both_sizes(tok, kind):
    V = as_tokenizer(tok).vocab_size
    dls = sft_dataloaders({'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4, hf_labels=True)
    with pytest.raises(ValueError, match=rf"tokenizer has {V} tokens.*embedding has {V - 40} rows.*resize_token_embeddings\({V}\)"):
        _fit(dls, _tiny(kind, V - 40))

def test_the_vocabulary_check_runs_once_a_pass_not_once_a_batch(tok):
    from aisaac.models import get_model_gpt, lm_loss
    V = as_tokenizer(tok).vocab_size
    dls = sft_dataloaders({'train': qa(WORDS * 2, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4)
    gpt = get_model_gpt(V - 40, n_layer=1, n_head=2, d_model=16, block_size=64)
    with pytest.raises(ValueError, match=rf"tokenizer has {V} tokens.*embedding has {V - 40} rows.*get_model_gpt\({V}"): _fit(dls, gpt, lm_loss)
    gpt = get_model_gpt(V, n_layer=1, n_head=2, d_model=16, block_size=64)
    calls, emb = [], gpt.get_input_embeddings
    gpt.get_input_embeddings = lambda: calls.append(1) or emb()
    t = _fit(dls, gpt, lm_loss, n=2)
    assert len(dls.train) > 4 and len(calls) == 4  # 2 epochs, a training and a validation pass each

def test_an_empty_split_is_named(tok):
    with pytest.raises(ValueError, match=r"The 'valid' split is empty"): sft_dataloaders({'train': qa(WORDS), 'valid': []}, tok)

@pytest.fixture
def csv(tmp_path):
    "A CSV file read by `datasets`, as a client would: numbers in a column become ints or floats, an empty cell None"
    from datasets import load_dataset
    def read(text):
        (tmp_path/'qa.csv').write_text(text)
        return load_dataset('csv', data_files=str(tmp_path/'qa.csv'), cache_dir=str(tmp_path/'cache'))['train']
    return read

def test_numbers_in_an_answer_column_are_their_text(tok, csv):
    ints, floats = csv('prompt,response\nQ: 37+45=,82\nQ: 1+1=,2\n'), csv('prompt,response\nQ: 9/2=,4.5\nQ: 2+2=,4\n')
    assert ints.features['response'].dtype == 'int64' and floats.features['response'].dtype == 'float64'
    assert [trained_text(tok, ex) for ex in tokenize_chats(ints, tok)] == [f'82{EOT}', f'2{EOT}']
    assert [trained_text(tok, ex) for ex in tokenize_chats(floats, tok)] == [f'4.5{EOT}', f'4{EOT}']  # the CSV's `4`, read as 4.0
    dls = sft_dataloaders({'train': ints, 'valid': ints}, tok, block_size=32, bs=2)
    assert len(dls.valid.tensors[0]) == 2

def test_an_empty_answer_is_an_error_naming_the_row_and_the_column(tok, csv):
    ds = csv('prompt,response\nQ: 37+45=,82\nQ: 1+1=,\nQ: 2+2=,4\n')
    with pytest.raises(ValueError, match=r"Example 1 has no 'response' \(an empty cell\?\)"): tokenize_chats(ds, tok)
    with pytest.raises(ValueError, match=r"Example 1 has no 'response'") as e: sft_dataloaders({'train': ds, 'valid': ds}, tok)
    assert "in the 'train' split" in str(e.value.__notes__)
    chat = [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': None}]
    with pytest.raises(ValueError, match=r"Example 0 has no 'messages'\[1\]\['content'\]"): tokenize_chats([{'messages': chat}], tok)

def test_tokenized_rows_whose_ids_and_labels_differ_in_length_are_named(tok):
    rows = [{'input_ids': [5, 6, 7, 8], 'labels': [-100, 6, 7, 8]}, {'input_ids': [5, 6, 7], 'labels': [-100, 6]}]
    for f in (lambda: sft_dataloaders({'train': rows, 'valid': rows}, tok), lambda: pad_examples(rows, 0), lambda: pack_examples(rows, 8, 0)):
        with pytest.raises(ValueError, match=r"Example 1 has 3 `input_ids` and 2 `labels`"): f()

def test_a_row_left_out_because_every_label_is_masked_is_told_so(tok):
    exs = tokenize_chats(qa(['cat', 'dog', 'tea']), tok)
    exs[1] = {'input_ids': exs[1]['input_ids'], 'labels': [-100] * len(exs[1]['input_ids'])}
    with pytest.warns(UserWarning) as w: kept = fit_examples(exs, 64)
    assert len(kept) == 2 and len(w) == 1
    msg = str(w[0].message)
    assert 'have more than' not in msg and re.search(r"1 of 3 examples left out: every label is -100.*#1", msg), msg
    exs.append({'input_ids': exs[0]['input_ids'] * 5, 'labels': exs[0]['labels'] * 5})  # and one too long, cut
    with pytest.warns(UserWarning) as w: fit_examples(exs, 40)
    msg = str(w[0].message)
    assert re.search(r"1 of 4 examples have more than 40 tokens: cut.*; 1 of 4 examples left out: every label is -100", msg), msg

@pytest.mark.parametrize('kind', ['gpt2', 'llama'])
def test_packed_rows_without_the_block_mask_are_refused_while_the_model_makes_a_cache(tok, kind):
    "`position_ids` alone keep documents apart only with `use_cache=False`: with the default cache, 0.08 (GPT-2) to 0.23 (Llama) of a logit leaked, silently"
    dls = sft_dataloaders({'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}, tok, block_size=64, bs=4, pack=True, hf_labels=True, block_mask=False)
    m = _tiny(kind, as_tokenizer(tok).vocab_size)
    with pytest.raises(ValueError, match=r"only `position_ids`.*`block_mask=True`.*`model.config.use_cache = False`"): _fit(dls, m)
    m.config.use_cache = False
    dls.check_model(m)
    b = next(iter(dls.valid))
    with torch.no_grad():
        out = m.eval()(**b).logits
        for r in range(4):
            for s, e in _docs(b['position_ids'][r]):
                torch.testing.assert_close(out[r, s:e], m(input_ids=b['input_ids'][r:r+1, s:e]).logits[0], atol=2e-5, rtol=1e-4)

# ------------------------------------------------------------------------------------------------ issue 46: two features together
@pytest.mark.parametrize('pack', [False, True])
def test_sft_labels_shifted_twice_or_not_at_all_are_refused_naming_the_flag(tok, pack):
    "An HF causal LM on shifted SFT batches learnt the reply token two ahead; aisaac's GPT with `lm_loss` on HF batches learnt to copy its input"
    from aisaac.models import get_model_gpt, lm_loss
    data = {'train': qa(WORDS, 3), 'valid': qa(WORDS, 3)}
    V = as_tokenizer(tok).vocab_size
    m = _tiny('gpt2', V)
    m.config.use_cache = False  # (packed without the block mask: allowed then)
    with pytest.raises(ValueError, match=r"next tokens already.*`hf_labels=False`.*two ahead.*`hf_labels=True`"):
        _fit(sft_dataloaders(data, tok, block_size=32, bs=4, pack=pack), m)
    gpt = get_model_gpt(V, n_layer=1, n_head=2, d_model=16, block_size=64)
    with pytest.raises(ValueError, match=r"`input_ids` themselves.*`hf_labels=True`.*copy its input.*`hf_labels=False`"):
        _fit(sft_dataloaders(data, tok, block_size=32, bs=4, pack=pack, hf_labels=True, block_mask=False), gpt, lm_loss)
    _fit(sft_dataloaders(data, tok, block_size=32, bs=4, pack=pack, hf_labels=True), _tiny('gpt2', V))  # as each takes them: fine
    _fit(sft_dataloaders(data, tok, block_size=32, bs=4, pack=pack), gpt, lm_loss)
