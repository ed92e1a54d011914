"""The text pipeline (aisaac.text) and the GPT on it: the corpus split by document, the tokenizer, packing, the caches and
their trust rules, dict batches, and training: a fit of steps, exact mid-epoch resume, accumulation, samples."""
import math, os, warnings
import pytest, torch
from aisaac.data import DataNotFoundError
from aisaac.text import load_text_corpus, read_fortunes, train_tokenizer, pack_tokens, text_dataloaders, decode, text_dir, EOT
from aisaac.models import get_model_gpt, lm_loss
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.gradients import GradAccumCB, GradClipCB
from aisaac.callbacks.schedule import WarmupCosineSchedulerCB
from aisaac.callbacks.savers import CheckpointCB
from aisaac.callbacks.samples import SampleCB
import aisaac.checkpoint  # noqa: F401

pytest.importorskip('tokenizers', reason="the text pipeline needs Hugging Face `tokenizers` (pip install 'aisaac[text]')")
try: text_dir()
except DataNotFoundError as e: pytest.skip(f"no text corpus here: {e}", allow_module_level=True)

@pytest.fixture(scope='module')
def dsd(): return load_text_corpus()

@pytest.fixture(scope='module')
def tok(dsd): return train_tokenizer(dsd['train'], vocab_size=512)

def test_the_split_is_by_whole_document_and_seeded(dsd):
    train, valid = list(dsd['train']['text']), list(dsd['valid']['text'])
    n = sum(len(read_fortunes(f)) for f in text_dir().iterdir() if f.is_file() and not f.suffix)
    assert len(train) + len(valid) == n and len(valid) == round(n * 0.1)
    assert set(valid) - set(train)  # held-out texts the training set lacks (a few texts are in the package twice)
    assert list(load_text_corpus(seed=42)['valid']['text']) == valid
    assert set(dsd['train']['source']) >= {'fortunes', 'science', 'literature'}

def test_a_missing_corpus_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv('AISAAC_TEXT', str(tmp_path))
    with pytest.raises(DataNotFoundError, match=r'apt-get install fortunes.*AISAAC_TEXT'): load_text_corpus()
    (tmp_path/'mine').write_text('First text.\n%\nSecond\ntext.\n%\n%\nThird.\n')
    assert read_fortunes(tmp_path/'mine') == ['First text.', 'Second\ntext.', 'Third.']
    d = load_text_corpus(valid_pct=0.34)
    assert len(d['train']) == 2 and len(d['valid']) == 1

def test_the_tokenizer_round_trips_any_text_and_is_cached(dsd, tok, tmp_path, monkeypatch):
    s = 'Quoth the Raven, "Nevermore."\n\t42 ≠ 43 ☃'
    assert tok.get_vocab_size() == 512 and tok.decode(tok.encode(s).ids) == s
    assert tok.encode(EOT).ids == [tok.token_to_id(EOT)]
    monkeypatch.setenv('AISAAC_CACHE', str(tmp_path))
    texts = list(dsd['valid']['text'])[:300]
    a = train_tokenizer(texts, vocab_size=300)
    (fn,) = (tmp_path/'text').glob('tokenizer-*.json')
    assert train_tokenizer(texts, vocab_size=300).to_str() == a.to_str()
    fn.write_text('{not json')  # a damaged cache: ignored with a warning, trained again, written again
    with pytest.warns(UserWarning, match='unreadable tokenizer cache'): b = train_tokenizer(texts, vocab_size=300)
    assert b.to_str() == a.to_str() and train_tokenizer(texts, vocab_size=300).to_str() == a.to_str()
    with pytest.raises(ValueError, match='at least 258'): train_tokenizer(texts, vocab_size=100)

def test_packing_joins_documents_with_end_of_text_and_cuts_blocks(dsd, tok, tmp_path, monkeypatch):
    monkeypatch.setenv('AISAAC_CACHE', str(tmp_path))
    texts = list(dsd['valid']['text'])[:200]
    blocks = pack_tokens(texts, tok, block_size=16)
    ids = [i for t in texts for i in (*tok.encode(t).ids, tok.token_to_id(EOT))]
    assert blocks.shape == (len(ids) // 17, 17) and blocks.flatten().tolist() == ids[:blocks.numel()]
    (fn,) = (tmp_path/'text').glob('tokens-*.pt')
    torch.save({'not': 'a tensor'}, fn)  # a cache holding something else: ignored, tokenized again
    with pytest.warns(UserWarning, match='holds no 1-d int64 tensor'): again = pack_tokens(texts, tok, block_size=16)
    assert torch.equal(again, blocks)

def test_dict_batches_shift_by_one_and_the_hugging_face_convention(dsd, tok):
    dls = text_dataloaders(dsd, tok, block_size=32, bs=8, seed=0)
    b = next(iter(dls.train))
    assert set(b) == {'input_ids', 'labels'} and b['input_ids'].shape == (8, 32)
    assert torch.equal(b['input_ids'][:, 1:], b['labels'][:, :-1])
    v = next(iter(dls.valid))
    assert decode(tok, torch.cat([v['input_ids'][0], v['labels'][0, -1:]])).startswith(list(dsd['valid']['text'])[0][:20])
    h = next(iter(text_dataloaders(dsd, tok, block_size=32, bs=8, hf_labels=True).valid))
    assert h['input_ids'].shape == (8, 33) and torch.equal(h['labels'], h['input_ids'])
    with pytest.raises(KeyError, match=r"No split 'valid': the splits are \['train'\]"): text_dataloaders({'train': dsd['train']}, tok)

def test_a_missing_tokenizers_package_names_the_extra(dsd, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, 'tokenizers', None)  # what `import tokenizers` meets where it is not installed
    with pytest.raises(ImportError, match=r"pip install 'aisaac\[text\]'"): train_tokenizer(list(dsd['valid']['text'])[:10], vocab_size=300)

class _RunsCode:
    "A pickle that calls `os.mkdir` when it is loaded without `weights_only`"
    def __init__(self, path): self.path = path
    def __reduce__(self): return (os.mkdir, (self.path,))

def test_the_token_cache_is_read_back_keyed_by_tokenizer_and_texts_and_runs_no_code(dsd, tok, tmp_path, monkeypatch):
    monkeypatch.setenv('AISAAC_CACHE', str(tmp_path))
    texts = list(dsd['valid']['text'])[:200]
    cold = pack_tokens(texts, tok, block_size=16, cache=False)
    assert not (tmp_path/'text').exists()
    first = pack_tokens(texts, tok, block_size=16)
    (fn,) = (tmp_path/'text').glob('tokens-*.pt')
    assert torch.equal(first, cold)
    assert torch.equal(pack_tokens(texts, tok, block_size=32).flatten()[:100], cold.flatten()[:100])
    assert list((tmp_path/'text').glob('tokens-*.pt')) == [fn]  # the stream is cached, whatever the block size
    torch.save(torch.zeros(17 * 5, dtype=torch.int64), fn)  # a hit is read, not tokenized again: the (doctored) cache comes back
    assert torch.equal(pack_tokens(texts, tok, block_size=16), torch.zeros(5, 17, dtype=torch.int64))
    pack_tokens(texts[1:], tok, block_size=16); pack_tokens(texts, train_tokenizer(texts, vocab_size=300), block_size=16)
    assert len(list((tmp_path/'text').glob('tokens-*.pt'))) == 3  # other texts or another tokenizer: other files
    torch.save(_RunsCode(str(tmp_path/'ran')), fn)  # loaded with weights_only=True: refused, never run
    with pytest.warns(UserWarning, match='unreadable token cache'): again = pack_tokens(texts, tok, block_size=16)
    assert torch.equal(again, cold) and not (tmp_path/'ran').exists()

def test_cold_and_cached_dataloaders_serve_the_same_blocks(dsd, tok, tmp_path, monkeypatch):
    monkeypatch.setenv('AISAAC_CACHE', str(tmp_path))
    cold = text_dataloaders(dsd, tok, block_size=64, bs=16, seed=0, cache=False)
    text_dataloaders(dsd, tok, block_size=64, bs=16, seed=0)  # writes both token streams
    hot = text_dataloaders(dsd, tok, block_size=64, bs=16, seed=0)
    assert len(list((tmp_path/'text').glob('tokens-*.pt'))) == 2
    for k in ('train', 'valid'): assert torch.equal(getattr(cold, k).tensors[0], getattr(hot, k).tensors[0])
    for a, b in zip(cold.train, hot.train): assert torch.equal(a['input_ids'], b['input_ids'])  # the same order under the same seed

# ---------------------------------------------------------------- the GPT on real text
def small(dsd, tok, cbs=(), bs=8, seed=0):
    torch.manual_seed(0)
    dls = text_dataloaders(dsd, tok, block_size=32, bs=bs, seed=seed)
    dls.train.tensors = (dls.train.tensors[0][:24 * 8],)  # 24 batches of 8 blocks an epoch
    dls.valid.tensors = (dls.valid.tensors[0][:32],)
    dls.train.n, dls.valid.n = 24 * 8, 32
    model = get_model_gpt(tok.get_vocab_size(), n_layer=2, n_head=2, d_model=32, block_size=32)
    return Trainer(dls, lm_loss, torch.optim.AdamW, model, callbacks=[BasicTrainCB(), MetricsCB(), GradClipCB(1.0), *cbs])

def test_a_gpt_learns_the_text_in_a_run_of_steps(dsd, tok):
    t = small(dsd, tok, [WarmupCosineSchedulerCB(warmup=10)])
    t.fit(steps=60, valid_every=30, lr=3e-3)
    assert t.clock.step == 60 and t.history.get_metric_steps('valid_loss') == [30, 60]
    first, last = t.history.get_metric_values('valid_loss')
    assert last < first < math.log(512) - 0.5, (first, last)

def test_mid_epoch_resume_of_the_gpt_is_bit_identical(dsd, tok, tmp_path):
    straight = small(dsd, tok, [WarmupCosineSchedulerCB(warmup=5)])
    straight.fit(steps=40, valid_every=20, lr=3e-3)
    first = small(dsd, tok, [WarmupCosineSchedulerCB(warmup=5), CheckpointCB(tmp_path, every='13 steps', every_n_epochs=None)])
    first.fit(steps=40, valid_every=20, lr=3e-3)
    last = sorted(tmp_path.glob('checkpoint_*.pt'))[-1]  # step 39: inside the second epoch of 24 batches
    resumed = small(dsd, tok, [WarmupCosineSchedulerCB(warmup=5)])
    resumed.fit(steps=40, valid_every=20, lr=3e-3, resume_from=last)
    for (k, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()): assert torch.equal(a, b), k
    assert resumed.history.get_metric_values('valid_loss') == straight.history.get_metric_values('valid_loss')

def test_four_accumulated_micro_batches_of_the_gpt_equal_one_batch_four_times_as_large(dsd, tok):
    big = small(dsd, tok, bs=8)
    big.fit(steps=6, lr=3e-3, valid=False)
    acc = small(dsd, tok, [GradAccumCB(4)], bs=2)
    acc.fit(steps=6, lr=3e-3, valid=False)
    assert acc.clock.step == big.clock.step == 6 and acc.clock.micro_step == 24
    for a, b in zip(big.model.parameters(), acc.model.parameters()): torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)  # AdamW steps of about 3e-3 each

def test_samples_while_training_leave_training_unchanged(dsd, tok):
    plain = small(dsd, tok)
    plain.fit(steps=20, lr=3e-3, valid=False)
    sampled = small(dsd, tok, [s := SampleCB('The meaning of life', tok, every='10 steps', max_new_tokens=12)])
    sampled.fit(steps=20, lr=3e-3, valid=False)
    assert [step for step, _ in s.samples] == [10, 20] and all(len(tok.encode(x).ids) >= 6 for _, x in s.samples)
    for a, b in zip(plain.model.parameters(), sampled.model.parameters()): assert torch.equal(a, b)

# ---------------------------------------------------------------- your own data and tokenizer (issue 28)
def _hf_tok(tok, **kw):
    transformers = pytest.importorskip('transformers')
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **kw)

def test_a_folder_of_txt_files_is_read_one_document_per_file_or_per_line(tmp_path):
    from aisaac.text import load_texts
    for i in range(10): (tmp_path/f'doc{i}.txt').write_text(f'Document {i}, line one.\nLine two of {i}.\n')
    (tmp_path/'notes.md').write_text('not read')
    d = load_text_corpus(tmp_path, valid_pct=0.2)  # was: "install fortunes"
    assert (len(d['train']), len(d['valid'])) == (8, 2) and sorted(list(d['train']['text']) + list(d['valid']['text']))[0] == 'Document 0, line one.\nLine two of 0.\n'
    lines = load_texts(tmp_path, by_line=True, valid_pct=0.25)
    assert len(lines['train']) + len(lines['valid']) == 20 and 'Line two of 3.' in list(lines['train']['text']) + list(lines['valid']['text'])
    with pytest.raises(DataNotFoundError, match=r'no \.txt, \.jsonl'): load_texts(tmp_path/'notes.md')

@pytest.mark.parametrize('fmt', ['jsonl', 'csv', 'parquet'])
def test_files_with_a_named_text_column_are_read_and_a_wrong_column_lists_the_columns(tmp_path, fmt):
    from datasets import Dataset
    from aisaac.text import load_texts
    ds = Dataset.from_dict({'body': [f'text number {i}' for i in range(20)], 'id': list(range(20))})
    fn = tmp_path/f'data.{fmt}'
    {'jsonl': ds.to_json, 'csv': ds.to_csv, 'parquet': ds.to_parquet}[fmt](str(fn))
    d = load_texts(fn, column='body')
    assert sorted(list(d['train']['text']) + list(d['valid']['text'])) == sorted(ds['body'])
    with pytest.raises(KeyError, match=r"no column 'text'; its columns are \['body', 'id'\]"): load_texts(fn)

def test_text_dataloaders_take_any_split_and_column_names(dsd, tok):
    from datasets import DatasetDict
    mine = DatasetDict(training=dsd['train'].rename_column('text', 'content'), validation=dsd['valid'].rename_column('text', 'content'))
    dls = text_dataloaders(mine, tok, block_size=32, bs=8, column='content', train_split='training')
    ref = text_dataloaders(dsd, tok, block_size=32, bs=8)
    assert torch.equal(dls.valid.tensors[0], ref.valid.tensors[0]) and torch.equal(dls.train.tensors[0], ref.train.tensors[0])
    with pytest.raises(KeyError, match=r"No split 'train': the splits are \['training', 'validation'\]"): text_dataloaders(mine, tok)
    with pytest.raises(KeyError, match=r"no column 'text'; its columns are \['content', 'source'\]"): text_dataloaders(mine, tok, train_split='training')

def test_a_transformers_tokenizer_and_one_with_its_own_end_of_text_token(dsd, tok):
    from aisaac.text import as_tokenizer
    texts = list(dsd['valid']['text'])[:100]
    hf = _hf_tok(tok, eos_token=EOT)
    assert torch.equal(pack_tokens(texts, hf, block_size=16, cache=False), pack_tokens(texts, tok, block_size=16, cache=False))  # was: AttributeError token_to_id
    tk = pytest.importorskip('tokenizers')
    other = tk.Tokenizer(tk.models.WordLevel({'[UNK]': 0, '</s>': 1, '<pad>': 2, 'a': 3, 'b': 4}, unk_token='[UNK]'))
    other.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    with pytest.raises(ValueError, match=r"no end-of-text token.*pass `eot=`"): pack_tokens(['a b'] * 20, other, block_size=4, cache=False)
    t = as_tokenizer(other, eot='</s>', pad='<pad>')
    assert (t.eot_id, t.pad_id, t.vocab_size) == (1, 2, 5)
    assert pack_tokens(['a b a'] * 5, t, block_size=3, cache=False)[0].tolist() == [3, 4, 3, 1]  # was: refused
    h = as_tokenizer(_hf_tok(other, eos_token='</s>', pad_token='<pad>'))
    assert (h.eot_id, h.pad_id, h.encode('a b'), h.decode([3, 1])) == (1, 2, [3, 4], 'a </s>')
    with pytest.raises(ValueError, match="`eot='<eos>'` is not in the tokenizer's vocabulary"): as_tokenizer(other, eot='<eos>')

def test_train_tokenizer_refuses_no_text_and_says_when_it_cannot_reach_the_vocabulary_size():
    with pytest.raises(ValueError, match='got no text'): train_tokenizer([], vocab_size=300, cache=False)  # was: 257 tokens, silently
    with pytest.raises(ValueError, match='got no text'): train_tokenizer(['', '  '], vocab_size=300, cache=False)
    with pytest.warns(UserWarning, match=r'made 2\d\d tokens, not the 5000 asked'): t = train_tokenizer(['a small text, a small text'], vocab_size=5000, cache=False)
    assert t.get_vocab_size() < 300

@pytest.mark.parametrize('hf', [False, True])
def test_a_model_smaller_than_the_tokenizers_vocabulary_is_refused_before_its_first_batch(dsd, tok, hf):
    "A transformers model too small for the tokenizer failed in its embedding with `IndexError: index out of range in self`"
    dls = text_dataloaders(dsd, tok, block_size=32, bs=8, hf_labels=hf)
    if hf:
        transformers = pytest.importorskip('transformers')
        model, loss = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=500, n_positions=33, n_embd=16, n_layer=1, n_head=2)), None
    else: model, loss = get_model_gpt(500, n_layer=1, n_head=2, d_model=16, block_size=32), lm_loss
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    t = Trainer(dls, loss, torch.optim.AdamW, model, callbacks=[BasicTrainCB()])
    with pytest.raises(ValueError, match=r"The tokenizer has 512 tokens, but the model's input embedding has 500 rows.*" +
                       (r"resize_token_embeddings\(512\)" if hf else r"get_model_gpt\(512, \.\.\.\)")): t.fit(1)
    assert calls == []  # before the model ran

# ------------------------------------------------------------------------------------------------ issue 46: two features together
def _tiny_gpt2(V=512, T=33):
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=16, n_layer=1, n_head=2,
                                                                bos_token_id=0, eos_token_id=0))

class OwnLM(torch.nn.Module):
    "A user's own model with its own loss: how it lines its labels up cannot be known, so nothing is refused"
    def __init__(self, V=512):
        super().__init__()
        self.emb = torch.nn.Embedding(V, 16)
        self.out = torch.nn.Linear(16, V)
    def forward(self, input_ids, labels=None):
        logits = self.out(self.emb(input_ids))
        return {'loss': lm_loss(logits[:, :-1], labels[:, 1:]), 'logits': logits}

@pytest.mark.parametrize('hf_labels, model, loss, fix', [
    (False, 'hf', None, r"labels.*next tokens already.*`hf_labels=False`.*shifts them once more.*two ahead.*`hf_labels=True`"),
    (True, 'gpt', lm_loss, r"`input_ids` themselves.*`hf_labels=True`.*`lm_loss`.*copy its input.*`hf_labels=False`"),
    (True, 'gpt', None, r"`input_ids` themselves.*`hf_labels=True`.*GPT.*copy its input.*`hf_labels=False`"),
    (True, 'hf', lm_loss, r"`input_ids` themselves.*`lm_loss`.*copy its input.*`hf_labels=False`.*`loss_func=None`")])
def test_labels_shifted_twice_or_not_at_all_are_refused_naming_the_flag(dsd, tok, hf_labels, model, loss, fix):
    "An HF causal LM on shifted batches learnt the token two ahead (valid loss 5.3751, next-token 5.3667); GPT on HF batches learnt to copy (3.8197 reported, 6.0136 true)"
    dls = text_dataloaders(dsd, tok, block_size=32, bs=8, hf_labels=hf_labels)
    m = _tiny_gpt2() if model == 'hf' else get_model_gpt(512, n_layer=1, n_head=2, d_model=16, block_size=33)
    calls = []
    m.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match=fix): Trainer(dls, loss, torch.optim.AdamW, m, callbacks=[BasicTrainCB()]).fit(1)
    assert calls == []  # refused before the model ran

@pytest.mark.parametrize('hf_labels, model, loss', [(True, 'hf', None), (False, 'hf', lm_loss), (False, 'gpt', lm_loss), (False, 'gpt', None),
                                                    (False, 'own', None), (True, 'own', None)])
def test_labels_as_the_model_and_loss_take_them_train(dsd, tok, hf_labels, model, loss):
    dls = text_dataloaders(dsd, tok, block_size=32, bs=8, hf_labels=hf_labels)
    dls.train.tensors, dls.valid.tensors = (dls.train.tensors[0][:16],), (dls.valid.tensors[0][:8],)
    dls.train.n, dls.valid.n = 16, 8
    m = {'hf': _tiny_gpt2, 'gpt': lambda: get_model_gpt(512, n_layer=1, n_head=2, d_model=16, block_size=33), 'own': OwnLM}[model]()
    Trainer(dls, loss, torch.optim.AdamW, m, callbacks=[BasicTrainCB()]).fit(1)
    assert dls.hf_labels is hf_labels and dls.train.hf_labels is hf_labels
