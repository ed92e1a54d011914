"MetricsCB with torcheval and torchmetrics metrics, on a small classification problem"
from types import SimpleNamespace
import torch
from torch import nn
import torcheval.metrics as tem
import torchmetrics
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
import pytest
from torcheval.metrics import MulticlassAccuracy


def dls(n=300, bs=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g); y = (x[:, 0] + x[:, 1] > 0).long()
    batches = [(x[i:i+bs], y[i:i+bs]) for i in range(0, n, bs)]
    return SimpleNamespace(train=batches, valid=batches)


def accuracy(model, dls):
    with torch.no_grad():
        x = torch.cat([b[0] for b in dls.valid]); y = torch.cat([b[1] for b in dls.valid])
        return (model(x).argmax(1) == y).float().mean().item()


def test_torcheval_and_torchmetrics_agree_with_a_hand_computed_accuracy():
    torch.manual_seed(0)
    d = dls()
    metrics = MetricsCB(te=tem.MulticlassAccuracy(), tm=torchmetrics.Accuracy(task='multiclass', num_classes=2))
    t = Trainer(d, nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(4, 2), callbacks=[BasicTrainCB(), metrics])
    t.fit(2, lr=0.05)
    last = metrics.metrics_epoch[-1]
    assert abs(last['te'] - accuracy(t.model, d)) < 1e-6
    assert abs(last['tm'] - last['te']) < 1e-6
    assert last['te'] > 0.9


def test_metrics_are_reset_between_epochs():
    "A model that does not learn (lr=0) gives the same accuracy every epoch: no accumulation across epochs"
    torch.manual_seed(0)
    metrics = MetricsCB(acc=tem.MulticlassAccuracy())
    t = Trainer(dls(), nn.CrossEntropyLoss(), torch.optim.SGD, nn.Linear(4, 2), callbacks=[BasicTrainCB(), metrics])
    t.fit(3, lr=0.)
    accs = [m['acc'] for m in metrics.metrics_epoch]
    assert accs[0] == accs[1] == accs[2]
    assert len({round(l['valid'], 6) for l in metrics.losses_epoch}) == 1


def test_positional_metrics_are_named_by_class():
    assert list(MetricsCB(tem.MulticlassAccuracy(), f1=tem.MulticlassF1Score()).metrics) == ['MulticlassAccuracy', 'f1']

def _fit_printing(*cbs, **kw):
    "What a 2-epoch fit prints, with `MetricsCB(**kw)` and `cbs`"
    import contextlib, io
    from aisaac.trainer import Trainer
    torch.manual_seed(0)
    x = torch.randn(96, 2); y = (x[:, 0] > 0).long()
    b = [(x[i:i+32], y[i:i+32]) for i in range(0, 96, 32)]
    t = Trainer(SimpleNamespace(train=b, valid=b), nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(2, 2),
                callbacks=[BasicTrainCB(), MetricsCB(acc=MulticlassAccuracy(), **kw), *cbs])
    out = io.StringIO()
    with contextlib.redirect_stdout(out): t.fit(2, lr=0.1)
    return out.getvalue().splitlines(), t

def test_metrics_are_printed_when_nothing_else_shows_them():
    "miniai's MetricsCB prints without a ProgressCB: aisaac's prints a line per epoch when no callback shows the numbers, and only then"
    from aisaac.callbacks.progress import ProgressCB, PrintProgressCB
    from aisaac.callbacks.loggers import ConsoleLogger, CSVLogger
    lines, t = _fit_printing()
    assert len(lines) == 2 and lines[1].startswith("{'epoch': 1, 'train': '") and "'acc': '" in lines[1], lines
    assert lines[1] == str({k: f'{v:.3f}' if isinstance(v, float) else v for k, v in
                            {'epoch': 1, **t.MetricsCB.losses_epoch[1], **t.MetricsCB.metrics_epoch[1]}.items()})
    assert len(_fit_printing(ProgressCB(bars=False))[0]) == 3  # the table: header and 2 rows, nothing from MetricsCB
    assert len(_fit_printing(PrintProgressCB())[0]) == 4  # its start line, 2 epochs, its end line
    assert len(_fit_printing(ConsoleLogger())[0]) == 2  # the logger's 2 lines only
    assert len(_fit_printing(show=False)[0]) == 0
    assert len(_fit_printing(ProgressCB(bars=False), show=True)[0]) == 5
    import tempfile, os
    with tempfile.TemporaryDirectory() as d:  # a logger that writes a file does not show anything: MetricsCB still prints
        assert len(_fit_printing(CSVLogger(os.path.join(d, 'log.csv')))[0]) == 2
    with pytest.raises(TypeError, match='give your metric another name'): MetricsCB(show=MulticlassAccuracy())

def test_metrics_on_dict_batches_and_batches_with_extra_items():
    "The metrics compare the predictions with the targets the loss used: a dict batch's `target_key`, a tuple's item after the inputs"
    from aisaac.trainer import Trainer
    torch.manual_seed(0)
    x = torch.randn(96, 2); y = (x[:, 0] > 0).long(); w = torch.ones(96, dtype=torch.long) * 7
    def fit(batches, step_cb):
        torch.manual_seed(1)
        t = Trainer(SimpleNamespace(train=batches, valid=batches), nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(2, 2),
                    callbacks=[step_cb, MetricsCB(acc=MulticlassAccuracy(), show=False)])
        t.fit(2, lr=0.1)
        return t.MetricsCB.metrics_epoch
    tuples = fit([(x[i:i+32], y[i:i+32]) for i in range(0, 96, 32)], BasicTrainCB())
    dicts = fit([{'image': x[i:i+32], 'cls': y[i:i+32], 'idx': w[i:i+32]} for i in range(0, 96, 32)], BasicTrainCB(input_keys='image', target_key='cls'))
    assert dicts == tuples and tuples[-1]['acc'] > 0.8
    extra = [(x[i:i+32], y[i:i+32], w[i:i+32]) for i in range(0, 96, 32)]
    torch.manual_seed(1)  # a loss that takes (preds, y, w): the metric must see y, not w
    t = Trainer(SimpleNamespace(train=extra, valid=extra), lambda p, y, w: nn.functional.cross_entropy(p, y), torch.optim.Adam, nn.Linear(2, 2),
          callbacks=[BasicTrainCB(), MetricsCB(acc=MulticlassAccuracy(), show=False)])
    t.fit(2, lr=0.1)
    assert t.MetricsCB.metrics_epoch == tuples


def test_metrics_move_to_the_models_device_before_a_pass_never_inside_a_batch():
    "On a GPU, copying a metric's state inside a batch waits for the GPU (found by tests/test_cuda.py's sync detector on an H200): "
    "the move happens at the start of the pass whose metrics it is, to the device of the model's parameters, once per fit"
    from aisaac.core.callback import Callback
    class Where(Callback):
        order = -100
        def before_fit(self, t): self.in_batch, self.t = False, t
        def before_batch(self, t): self.in_batch = True
        def cleanup_batch(self, t): self.in_batch = False
    where, moves = Where(), []
    class Acc(tem.MulticlassAccuracy):
        def to(self, device, *a, **k):
            moves.append((torch.device(device), where.in_batch, where.t.training))
            return super().to(device, *a, **k)
    for train_metrics, first in ((False, False), (True, True)):
        moves.clear()
        t = Trainer(dls(), nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(4, 2),
                    callbacks=[BasicTrainCB(), MetricsCB(Accuracy=Acc(), train_metrics=train_metrics, show=False), where])
        t.fit(2, lr=0.05)
        # one move per fit (train_metrics: the training copy is moved too, with the others, before the first training pass)
        assert moves and all(d == torch.device('cpu') and not inb for d, inb, _ in moves), moves
        assert {tr for _, _, tr in moves} == {first} and len(moves) == (2 if train_metrics else 1), moves


def _padded_lm_batches(lengths, vocab=20, seed=0):
    "Right-padded rows with Hugging Face's labels: the `input_ids` themselves, -100 on the padding"
    g, res = torch.Generator().manual_seed(seed), []
    for rows in lengths:
        ids, labels = torch.zeros(len(rows), max(rows), dtype=torch.long), torch.full((len(rows), max(rows)), -100)
        for i, n in enumerate(rows): ids[i, :n] = labels[i, :n] = torch.randint(1, vocab, (n,), generator=g)
        res.append({'input_ids': ids, 'labels': labels})
    return res


class ShiftingLM(nn.Module):
    "A model that computes its own loss as a Hugging Face causal LM does: position t predicts labels[t + 1]"
    shifts_labels = True
    def __init__(self, vocab=20): super().__init__(); self.emb = nn.Embedding(vocab, vocab)
    def forward(self, input_ids, labels):
        logits = self.emb(input_ids)
        return {'loss': nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100), 'logits': logits}


def _hand_loss(model, batches):
    "The validation loss by hand: every predicted token's loss (a row of n labels predicts n-1), over their number"
    with torch.no_grad():
        losses = [nn.functional.cross_entropy(model(**b)['logits'][:, :-1].flatten(0, 1), b['labels'][:, 1:].flatten(), reduction='none')
                  for b in batches]
        kept = [l[b['labels'][:, 1:].flatten() != -100] for l, b in zip(losses, batches)]
    return torch.cat(kept).mean().item()


@pytest.mark.parametrize('model', ['own', 'huggingface'])
def test_the_loss_of_a_model_that_shifts_its_labels_counts_n_minus_1_tokens_a_row(model):
    "Padded batches of very different lengths: the validation loss (and so the perplexity) is the token-weighted mean over predicted tokens"
    batches = _padded_lm_batches([[9, 2], [3], [12, 11, 2], [2, 2]])
    torch.manual_seed(0)
    if model == 'own': m = ShiftingLM()
    else:
        transformers = pytest.importorskip('transformers')
        cfg = transformers.GPT2Config(vocab_size=20, n_positions=16, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0., embd_pdrop=0., attn_pdrop=0.)
        m = transformers.GPT2LMHeadModel(cfg)
        m.forward = (lambda f: lambda **kw: dict(f(**kw)))(m.forward)  # the output as a dict, for `_hand_loss`
    t = Trainer(SimpleNamespace(train=batches, valid=batches), None, torch.optim.SGD, m, callbacks=[BasicTrainCB(), MetricsCB(show=False)])
    t.fit(1, lr=0.1, train=False)
    m.eval()
    assert t.MetricsCB.losses_epoch[-1]['valid'] == pytest.approx(_hand_loss(m, batches), rel=1e-6)


def test_a_callback_after_metricscb_reads_this_epochs_row_in_after_epoch():
    """miniai's MetricsCB logs in `after_epoch`: a stopper or saver ordered after it (`order = 10`) reads the epoch's row there. Before,
    aisaac's made the row in `cleanup_epoch`, so such a callback saw 0 rows at epoch 0 and epoch 0's row at epoch 1, silently"""
    from aisaac.core.callback import Callback
    class Reader(Callback):
        order = 10
        def __init__(self): self.seen, self.logged = [], []
        def log_metrics(self, trainer, metrics): self.logged.append(metrics)
        def after_epoch(self, trainer):
            m = trainer.MetricsCB
            self.seen.append((trainer.epoch, trainer.training, len(m.losses_epoch), len(m.metrics_epoch), dict(m.losses_epoch[-1]) if m.losses_epoch else None,
                              trainer.history.get_metric_steps('valid_loss')[-1:] if 'valid_loss' in trainer.history.metric_names else []))
    torch.manual_seed(0)
    r = Reader()
    t = Trainer(dls(), nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(4, 2), callbacks=[BasicTrainCB(), MetricsCB(acc=MulticlassAccuracy(), show=False), r])
    t.fit(2, lr=0.05)
    valid = [s for s in r.seen if not s[1]]
    assert [(e, n, k, h) for e, _, n, k, _, h in valid] == [(0, 1, 1, [0]), (1, 2, 2, [1])], r.seen
    assert [s[4] for s in valid] == t.MetricsCB.losses_epoch  # this epoch's row, not the one before
    assert [{k: v for k, v in row.items() if k != 'epoch'} for row in r.logged] == [{**l, **m} for l, m in zip(t.MetricsCB.losses_epoch, t.MetricsCB.metrics_epoch)]
    # without validation the row is made after the training pass, and read there
    r2 = Reader()
    t.fit(1, valid=False, callbacks=r2)
    assert [(tr, n) for _, tr, n, *_ in r2.seen] == [(True, 3)] and r2.seen[0][4] == t.MetricsCB.losses_epoch[-1] and 'valid' not in r2.seen[0][4]


def test_a_pass_cancelled_before_after_epoch_still_makes_its_row_once():
    "A CancelEpochException in the validation pass skips `after_epoch`: the row is made in `cleanup_epoch`, from the batches done, once"
    from aisaac.core.callback import Callback, CancelEpochException
    class StopValid(Callback):
        def after_batch(self, trainer):
            if not trainer.training and trainer.batch_num == 1: raise CancelEpochException()
    class StopAfter(Callback):  # after MetricsCB in `after_epoch`: the row is made already
        order = 10
        def after_epoch(self, trainer):
            if not trainer.training: raise CancelEpochException()
    for cb, n_valid in ((StopValid(), 2), (StopAfter(), 10)):
        torch.manual_seed(0)
        t = Trainer(dls(), nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(4, 2), callbacks=[BasicTrainCB(), MetricsCB(show=False), cb])
        t.fit(2, lr=0.05)
        assert len(t.MetricsCB.losses_epoch) == 2 and t.history.get_metric_steps('valid_loss') == [0, 1]
        assert len(t.history.get_metric_values('valid_loss', per='batch')) == 2 * n_valid


def test_a_stop_after_metricscb_in_after_epoch_keeps_the_epochs_row_in_the_table_and_on_the_bar():
    """Issue 38, the custom-callbacks tutorial's stopper: it reads the epoch's row in `after_epoch`, after MetricsCB, and raises
    CancelFitException at epoch 2. The progress table has the rows of epochs 0, 1 and 2, and the bar says 3 epochs done (before:
    stopping from `log_metrics` dropped the stopping epoch's row, and the bar stayed at 2/10)"""
    import contextlib, io
    from aisaac.core.callback import Callback, CancelFitException
    from aisaac.callbacks.progress import ProgressCB
    class Stop(Callback):
        order = MetricsCB.order + 1
        def __init__(self): self.rows = []
        def after_epoch(self, trainer):
            if trainer.training: return
            self.rows.append(trainer.MetricsCB.metrics_epoch[-1])
            if trainer.epoch == 2: raise CancelFitException()
    for bars in (False, True):
        torch.manual_seed(0)
        p, stop, out = ProgressCB(bars=bars), Stop(), io.StringIO()
        t = Trainer(dls(), nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(4, 2), callbacks=[BasicTrainCB(), MetricsCB(acc=MulticlassAccuracy()), p, stop])
        with contextlib.redirect_stdout(out): t.fit(10, lr=0.05)
        assert stop.rows == t.MetricsCB.metrics_epoch and len(stop.rows) == 3 and t.outcome == 'cancelled'
        if not bars: assert [l.split()[0] for l in out.getvalue().splitlines()] == ['epoch', '0', '1', '2'], out.getvalue()
        else: assert (p.rows, p.mbar.main_bar.last_v) == (3, 3)


def _sets(**sets):
    from aisaac.evals import EvalSetsCB
    return EvalSetsCB(**sets)

def test_an_evaluation_sets_pass_cancelled_or_failing_keeps_the_epochs_row():
    """Evaluation sets (aisaac.evals): a CancelEpochException in the pass on `dls.valid` or on set `a` ends that pass only; its batches
    so far are recorded, the sets after it run, and the epoch's row is logged once, after the last. An error in set `a`'s pass logs
    the epoch's row (dls.valid's numbers, a's so far) before the fit raises; b, after it, is not evaluated"""
    from aisaac.core.callback import Callback, CancelEpochException
    class Stop(Callback):
        def __init__(self, where, exc): self.where, self.exc = where, exc
        def after_batch(self, trainer):
            if not trainer.training and getattr(trainer.eval_set, 'name', 'valid') == self.where and trainer.batch_num == 0: raise self.exc
    class Rows(Callback):
        def __init__(self): self.rows = []
        def log_metrics(self, trainer, metrics): self.rows.append(metrics)
    d = dls()
    for where in ('valid', 'a'):
        torch.manual_seed(0)
        rows = Rows()
        t = Trainer(d, nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(4, 2), callbacks=[BasicTrainCB(), MetricsCB(acc=MulticlassAccuracy(), show=False),
                    _sets(a=d.valid[:3], b=d.valid[3:5]), Stop(where, CancelEpochException()), rows])
        t.fit(2, lr=0.05)
        assert [list(r) for r in rows.rows] == [['epoch', 'train', 'valid', 'acc', 'a/valid', 'a/acc', 'b/valid', 'b/acc']] * 2
        n = {'valid': len(d.valid), 'a': 3, 'b': 2, where: 1}
        for s in ('valid', 'a', 'b'):
            name = 'valid_loss' if s == 'valid' else f'{s}/valid_loss'
            assert t.history.get_metric_steps(name) == [0, 1] and len(t.history.get_metric_values(name, per='batch')) == 2 * n[s], s
    torch.manual_seed(0)
    rows = Rows()
    t = Trainer(d, nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(4, 2), callbacks=[BasicTrainCB(), MetricsCB(acc=MulticlassAccuracy(), show=False),
                _sets(a=d.valid[:3], b=d.valid[3:5]), Stop('a', ValueError('a bad batch')), rows])
    with pytest.raises(ValueError, match='a bad batch'): t.fit(2, lr=0.05)
    assert len(rows.rows) == 1 and rows.rows[0]['b/valid'] is None and rows.rows[0]['valid'] == t.history.get_latest_metric('valid_loss')
    assert t.history.metric_names == ['train_loss', 'valid_loss', 'acc', 'a/valid_loss', 'a/acc'] and t.history.get_metric_steps('a/valid_loss') == [0]

def test_each_evaluation_set_has_its_own_metrics_on_the_models_device_reset_each_pass():
    "A set without metrics of its own gets copies of MetricsCB's (not the same objects), moved with them to the model's device, reset after each pass"
    d = dls()
    m = MetricsCB(acc=MulticlassAccuracy(), show=False)
    t = Trainer(d, nn.CrossEntropyLoss(), torch.optim.SGD, nn.Linear(4, 2), callbacks=[BasicTrainCB(), m, _sets(a=d.valid, b=d.valid)])
    t.fit(2, lr=0.)
    assert m.set_metrics['a']['acc'] is not m.metrics['acc'] and m.set_metrics['a']['acc'] is not m.set_metrics['b']['acc']
    h = t.history
    assert h.get_metric_values('acc') == h.get_metric_values('a/acc') == h.get_metric_values('b/acc') and len(set(h.get_metric_values('acc'))) == 1
    assert all(m.device == torch.device('cpu') for m in m.set_metrics['a'].values())

def test_a_batch_with_several_targets_weighs_its_loss_by_its_samples():
    "Multi-task batches `(x, (y_cls, y_reg))`: the epoch's loss is the mean over the 68 samples (before: each batch counted 2, the length of the tuple, so the last batch of 4 weighed as much as one of 32: 4.466747 where the mean is 4.321424)"
    g = torch.Generator().manual_seed(0)
    x, yc, yr = torch.randn(68, 4, generator=g), torch.randint(0, 3, (68,), generator=g), torch.randn(68, 1, generator=g)
    batches = [(x[i:i + 32], (yc[i:i + 32], yr[i:i + 32])) for i in range(0, 68, 32)]  # 32, 32, 4
    class Two(nn.Module):
        def __init__(self): super().__init__(); self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 1)
        def forward(self, x): return self.a(x), self.b(x)
    loss = lambda p, y: nn.functional.cross_entropy(p[0], y[0]) + 10 * nn.functional.mse_loss(p[1], y[1])
    torch.manual_seed(0)
    t = Trainer(SimpleNamespace(train=batches, valid=batches), loss, torch.optim.SGD, Two(), callbacks=[BasicTrainCB(), MetricsCB(show=False)])
    t.fit(1, train=False)
    with torch.no_grad(): expected = (nn.functional.cross_entropy(t.model.a(x), yc) + 10 * nn.functional.mse_loss(t.model.b(x), yr)).item()
    assert t.history.get_latest_metric('valid_loss') == pytest.approx(expected, rel=1e-6)
