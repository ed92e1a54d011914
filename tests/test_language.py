"""The loop's parts that language models need: models that compute their own loss (Hugging Face style), losses weighted by
tokens, perplexity, tokens/s, accumulation on sequence batches, and every logger on such a run."""
import math, types, json, csv
import pytest, torch
import torch.nn.functional as F
from torch import nn
from torcheval.metrics.text import Perplexity
from aisaac.trainer import Trainer
from aisaac.core.callback import Callback
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.gradients import GradAccumCB, GradClipCB, MicroBatchCB
from aisaac.callbacks.loggers import ConsoleLogger, CSVLogger, JSONLinesLogger
from aisaac.callbacks.trackers import TensorBoardLogger, MLflowLogger

V, T = 40, 12

class TinyLM(nn.Module):
    "An embedding and a linear layer over a causal running mean: enough to learn next-token statistics"
    def __init__(self, own_loss=False):
        super().__init__()
        self.emb, self.out, self.own_loss = nn.Embedding(V, 32), nn.Linear(32, V), own_loss
    def forward(self, input_ids, labels=None):
        h = self.emb(input_ids).cumsum(1) / torch.arange(1, input_ids.shape[1] + 1)[:, None]
        logits = self.out(h)
        if not self.own_loss: return logits
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return types.SimpleNamespace(loss=loss, logits=logits)  # what a Hugging Face causal LM returns, with shifted labels given

def lm_loss(logits, labels): return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)

def lm_batches(n, bs, seed=0, pad_last=0):
    "Dict batches of a repeating pattern: `labels` are the next tokens; `pad_last` positions of the last batch are ignored (-100)"
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (n * bs, T + 1), generator=g)
    ids[:, 1::2] = (ids[:, ::2][:, :ids[:, 1::2].shape[1]] * 3) % V  # every other token follows from the one before
    res = [{'input_ids': ids[i:i+bs, :-1], 'labels': ids[i:i+bs, 1:].clone()} for i in range(0, len(ids), bs)]
    if pad_last: res[-1]['labels'][:, -pad_last:] = -100
    return res

def trainer(own=False, cbs=(), n=8, bs=4, **kw):
    torch.manual_seed(0)
    dls = types.SimpleNamespace(train=lm_batches(n, bs), valid=lm_batches(3, bs, seed=1, pad_last=5))
    return Trainer(dls, None if own else lm_loss, torch.optim.AdamW, TinyLM(own), callbacks=[BasicTrainCB(), *cbs], **kw)

def test_a_model_that_returns_its_own_loss_trains_like_one_given_a_loss_function():
    "Same weights, loss and predictions: the model's `loss` (HF style: no loss_func, the whole batch by name) and `logits`"
    a, b = trainer(own=False, cbs=[MetricsCB()]), trainer(own=True, cbs=[MetricsCB()])
    a.fit(2, lr=1e-2); b.fit(2, lr=1e-2)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()): assert torch.allclose(pa, pb, atol=1e-6)
    assert a.history.get_metric_values('valid_loss') == pytest.approx(b.history.get_metric_values('valid_loss'), rel=1e-5)
    assert b.preds.shape == (4, T, V)

def test_a_model_without_a_loss_says_how_to_get_one():
    t = trainer(own=True)
    t.dls.train = [{'input_ids': b['input_ids']} for b in t.dls.train]  # no labels: the model returns loss=None
    with pytest.raises(ValueError, match="give the batch its labels, or give the Trainer a `loss_func`"): t.fit(1)

def test_the_epoch_loss_is_the_mean_over_tokens_and_perplexity_is_its_exponential():
    "The validation set's last batch has 5 ignored positions: weighting batches by sequences would count them; by tokens it is exact"
    t = trainer(cbs=[m := MetricsCB(perplexity=Perplexity(ignore_index=-100))])
    t.fit(1, lr=1e-2)
    nll, n = 0., 0
    with torch.no_grad():
        for b in t.dls.valid:
            logits = t.model(b['input_ids'])
            nll += F.cross_entropy(logits.flatten(0, 1), b['labels'].flatten(), ignore_index=-100, reduction='sum').item()
            n += (b['labels'] != -100).sum().item()
    assert t.history.get_latest_metric('valid_loss') == pytest.approx(nll / n, rel=1e-5)
    assert t.history.get_latest_metric('perplexity') == pytest.approx(math.exp(nll / n), rel=1e-4)

@pytest.mark.parametrize('how', ['accumulation', 'microbatches'])
def test_four_microbatches_equal_one_batch_four_times_as_large(how):
    "GradAccumCB(4) over batches of 2 sequences, or MicroBatchCB(4) over batches of 8, against plain batches of 8: the same weights"
    torch.manual_seed(0)
    big = trainer(n=4, bs=8, cbs=[GradClipCB(1.0)])
    big.fit(1, lr=1e-2, valid=False)
    if how == 'accumulation': small = trainer(n=16, bs=2, cbs=[GradAccumCB(4), GradClipCB(1.0)])
    else: small = trainer(n=4, bs=8, cbs=[MicroBatchCB(4), GradClipCB(1.0)])
    small.fit(1, lr=1e-2, valid=False)
    assert small.clock.step == big.clock.step == 4
    for pa, pb in zip(big.model.parameters(), small.model.parameters()): assert torch.allclose(pa, pb, atol=1e-5)

def test_a_model_with_its_own_loss_feeds_metrics_and_every_logger(tmp_path, monkeypatch, capsys):
    pytest.importorskip('tensorboard'); pytest.importorskip('mlflow')
    monkeypatch.chdir(tmp_path)
    loggers = [ConsoleLogger(), CSVLogger(tmp_path/'e.csv'), JSONLinesLogger(tmp_path/'l.jsonl'), TensorBoardLogger(tmp_path/'tb'),
               MLflowLogger(f'sqlite:///{tmp_path}/m.db')]
    t = trainer(own=True, cbs=[MetricsCB(perplexity=Perplexity(ignore_index=-100)), *loggers])
    t.fit(steps=10, valid_every=5, lr=1e-2)
    assert t.history.get_metric_steps('perplexity') == [5, 10]
    rows = list(csv.DictReader(open(tmp_path/'e.csv')))
    assert [float(r['perplexity']) for r in rows] == pytest.approx(t.history.get_metric_values('perplexity'))
    assert any(json.loads(l).get('perplexity') for l in open(tmp_path/'l.jsonl'))
    assert 'perplexity' in capsys.readouterr().out
    from mlflow.tracking import MlflowClient
    run = MlflowClient(f'sqlite:///{tmp_path}/m.db').get_run(t.MLflowLogger.run_id)
    assert run.data.metrics['perplexity'] == pytest.approx(t.history.get_latest_metric('perplexity'))

# ---------------------------------------------------------------- a Hugging Face model
def hf_batches(n, bs, seed=0):
    "Hugging Face's convention: `labels` are the inputs themselves (the model shifts them): the same tokens as `lm_batches`"
    return [{'input_ids': torch.cat([b['input_ids'], b['labels'][:, -1:]], 1), 'labels': torch.cat([b['input_ids'], b['labels'][:, -1:]], 1)}
            for b in lm_batches(n, bs, seed)]

def test_a_hugging_face_gpt2_trains_with_its_own_loss():
    transformers = pytest.importorskip('transformers', reason="the Hugging Face path needs `transformers` (pip install 'aisaac[transformers]')")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=T + 1, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    dls = types.SimpleNamespace(train=hf_batches(8, 4), valid=hf_batches(3, 4, seed=1))
    t = Trainer(dls, None, torch.optim.AdamW, model, callbacks=[BasicTrainCB(), MetricsCB(), GradClipCB(1.0)])
    with torch.no_grad(): before = sum(model(**b).loss.item() for b in dls.valid) / 3
    t.fit(4, lr=3e-3)
    assert t.preds.shape == (4, T + 1, V)  # the logits, taken from the model's output
    model.eval()
    with torch.no_grad(): after = sum(model(**b).loss.item() for b in dls.valid) / 3  # batches of equal size: the plain mean
    assert t.history.get_latest_metric('valid_loss') == pytest.approx(after, rel=1e-5)
    assert after < before - 0.3, (before, after)

def test_a_hugging_face_model_given_a_loss_function_passes_it_its_logits():
    "With a `loss_func`, a Hugging Face model's output (a `ModelOutput`) gives the loss function and the metrics its `logits`"
    transformers = pytest.importorskip('transformers', reason="the Hugging Face path needs `transformers` (pip install 'aisaac[transformers]')")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=T, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    dls = types.SimpleNamespace(train=lm_batches(8, 4), valid=lm_batches(3, 4, seed=1))  # labels shifted already: `lm_loss` compares
    t = Trainer(dls, lm_loss, torch.optim.AdamW, model, callbacks=[BasicTrainCB(), MetricsCB()])
    t.fit(1, lr=3e-3)
    assert isinstance(t.preds, torch.Tensor) and t.preds.shape == (4, T, V)
    model.eval()
    with torch.no_grad(): want = sum(lm_loss(model(b['input_ids']).logits, b['labels']).item() for b in dls.valid) / 3
    assert t.history.get_latest_metric('valid_loss') == pytest.approx(want, rel=1e-5)

# ---------------------------------------------------------------- the rest of the catalogue on sequence batches
def test_bf16_clipping_compile_and_a_checkpoint_resume_on_a_language_model(tmp_path):
    "MixedPrecisionCB (bf16 on the CPU), GradClipCB, CompileCB and CheckpointCB on dict batches; the resumed run ends where the straight one does"
    from aisaac.callbacks.precision import MixedPrecisionCB
    from aisaac.callbacks.compilation import CompileCB
    from aisaac.callbacks.savers import CheckpointCB
    import aisaac.checkpoint  # noqa: F401
    cbs = lambda: [MetricsCB(perplexity=Perplexity(ignore_index=-100)), MixedPrecisionCB(), GradClipCB(1.0)]
    straight = trainer(cbs=cbs())
    straight.fit(steps=12, valid_every=4, lr=1e-2)
    assert straight.clock.step == 12 and straight.history.get_metric_steps('perplexity') == [4, 8, 12]
    assert all(math.isfinite(v) for v in straight.history.get_metric_values('valid_loss'))
    first = trainer(cbs=[*cbs(), CheckpointCB(tmp_path, every='5 steps', every_n_epochs=None)])
    first.fit(steps=12, valid_every=4, lr=1e-2)
    resumed = trainer(cbs=cbs())
    resumed.fit(steps=12, valid_every=4, lr=1e-2, resume_from=tmp_path/sorted(p.name for p in tmp_path.glob('checkpoint_*.pt'))[-1])
    for pa, pb in zip(straight.model.parameters(), resumed.model.parameters()): assert torch.equal(pa, pb)
    assert resumed.history.get_metric_values('valid_loss') == straight.history.get_metric_values('valid_loss')
    compiled = trainer(cbs=[*cbs(), CompileCB()])
    compiled.fit(steps=4, valid_every=4, lr=1e-2)
    assert compiled.history.get_latest_metric('valid_loss') == pytest.approx(straight.history.get_metric_values('valid_loss')[0], rel=2e-2)

# ---------------------------------------------------------------- issue 46: a model's own loss, in either order
class TupleLM(TinyLM):
    "nanoGPT's contract: `logits, loss = model(idx, targets)`; or, `order='loss first'`, `(loss, logits)` as transformers' `return_dict=False`"
    def __init__(self, order='logits first', extra=()):
        super().__init__(False)
        self.order, self.extra = order, extra
    def forward(self, idx, targets=None):
        logits = super().forward(idx)
        loss = lm_loss(logits, targets)
        out = (logits, loss) if self.order == 'logits first' else (loss, logits)
        return (*out, *self.extra)

def tuple_trainer(model, cbs=()):
    torch.manual_seed(0)
    tup = lambda bs: [(b['input_ids'], b['labels']) for b in bs]
    dls = types.SimpleNamespace(train=tup(lm_batches(8, 4)), valid=tup(lm_batches(3, 4, seed=1, pad_last=5)))
    return Trainer(dls, None, torch.optim.AdamW, model, callbacks=[BasicTrainCB(), MetricsCB(show=False), *cbs])

@pytest.mark.parametrize('order', ['logits first', 'loss first'])
def test_a_model_returning_logits_and_loss_in_either_order_trains_on_its_own_loss(order):
    "`(logits, loss)` (nanoGPT) was refused with a misleading hint ('give the batch its labels'), its loss taken for the predictions"
    torch.manual_seed(0); ref = TinyLM(False)
    a = trainer(own=False, cbs=[MetricsCB(show=False)]); a.fit(2, lr=1e-2)
    torch.manual_seed(0); m = TupleLM(order)
    b = tuple_trainer(m); b.fit(2, lr=1e-2)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()): assert torch.allclose(pa, pb, atol=1e-6)
    assert b.history.get_metric_values('valid_loss') == pytest.approx(a.history.get_metric_values('valid_loss'), rel=1e-5)
    assert b.preds.shape == (4, T, V)  # the metrics get the logits, in either order

def test_the_logits_of_a_tuple_are_its_first_tensor_that_is_not_the_loss():
    "What `SampleCB` generates from: nanoGPT's model without targets returns `(logits, None)`, whose second item was taken for the logits"
    from aisaac.callbacks.train import _logits
    x, loss = torch.randn(2, 3, 4), torch.tensor(1.)
    assert _logits((x, None)) is x and _logits((loss, x)) is x and _logits((x, loss)) is x and _logits((loss, x, (x, x))) is x

def test_a_model_whose_loss_cannot_be_told_apart_names_both_orders():
    zero = torch.tensor(0.)
    for m in (TupleLM('logits first', extra=(zero,)), TupleLM('loss first', extra=(zero,))):  # two 0-dim tensors: which is the loss?
        with pytest.raises(ValueError, match=r"2 0-dim tensors.*`\(loss, logits\)` or `\(logits, loss\)`"): tuple_trainer(m).fit(1)
    class LogitsOnly(TinyLM):
        def forward(self, idx, targets=None): return (super().forward(idx), super().forward(idx))
    with pytest.raises(ValueError, match=r"no 0-dim tensor.*`\(loss, logits\)` or `\(logits, loss\)`"): tuple_trainer(LogitsOnly()).fit(1)
