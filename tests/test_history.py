"The run history (`trainer.history`), `trainer.log` and the `log`/`log_image` events."
import io, math
import pytest, torch
from aisaac.history import RunHistory
from aisaac.core.callback import Callback
from tiny import make_trainer

class Collect(Callback):
    "Records every `log` and `log_image` event"
    def __init__(self): self.logs, self.images = [], []
    def log(self, trainer, metrics, step, per): self.logs.append((metrics, step, per))
    def log_image(self, trainer, name, image, step): self.images.append((name, image.shape, step))

def test_series_keep_values_and_steps_per_epoch_and_per_batch():
    h = RunHistory()
    for i, v in enumerate([3., 2., 1.]): h.update_metric('train_loss', v)
    for i in range(5): h.update_metric('lr', torch.tensor(0.1 * i), per='batch')
    h.update_metric('acc', 0.7, step=2)
    assert h.get_metric_values('train_loss') == [3., 2., 1.] and h.get_metric_steps('train_loss') == [0, 1, 2]
    assert h.get_latest_metric('acc') == 0.7 and h.get_metric_steps('acc') == [2]
    assert h.get_metric_values('lr', per='batch') == pytest.approx([0., 0.1, 0.2, 0.3, 0.4])
    assert h.metric_names == ['train_loss', 'acc'] and h.batch_metric_names == ['lr']
    assert h.get_metric_names('batch') == ['lr']
    h.update_metric('train_loss', 0.5)  # no step: one after the last
    assert h.get_metric_steps('train_loss') == [0, 1, 2, 3]

def test_errors_name_the_fix():
    h = RunHistory()
    with pytest.raises(KeyError, match="MetricsCB"): h.get_latest_metric('valid_loss')
    h.update_metric('lr', 0.1, per='batch')
    with pytest.raises(KeyError, match="per='batch'"): h.get_metric_values('lr')
    with pytest.raises(ValueError, match="'epoch' or 'batch'"): h.update_metric('x', 1., per='epochs')
    with pytest.raises(TypeError, match="string"): h.update_metric(3, 1.)

def test_to_dataframe_lines_series_up_by_step():
    h = RunHistory()
    for e in range(3): h.update_metric('train_loss', 1. / (e + 1))
    h.update_metric('acc', 0.9, step=1)
    df = h.to_dataframe()
    assert df.index.name == 'epoch' and df.index.tolist() == [0, 1, 2]
    assert df['train_loss'].tolist() == pytest.approx([1., .5, 1/3])
    assert math.isnan(df['acc'][0]) and df['acc'][1] == 0.9 and math.isnan(df['acc'][2])
    assert h.to_dataframe('batch').empty

def test_to_dataframe_without_pandas_says_how_to_install(monkeypatch):
    import builtins
    real = builtins.__import__
    def no_pandas(name, *a, **kw):
        if name == 'pandas': raise ImportError('No module named pandas')
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, '__import__', no_pandas)
    with pytest.raises(ImportError, match="pip install pandas"): RunHistory().to_dataframe()

def test_state_dict_round_trips_through_a_weights_only_load():
    h = RunHistory()
    h.update_metric('valid_loss', torch.tensor(0.25)); h.update_metric('valid_loss', 0.125, step=4)
    h.update_metric('grad_norm', torch.tensor(2.), per='batch')
    buf = io.BytesIO(); torch.save(h.state_dict(), buf); buf.seek(0)
    h2 = RunHistory(); h2.update_metric('stale', 1.)
    h2.load_state_dict(torch.load(buf, weights_only=True))
    assert h2.metric_names == ['valid_loss'] and h2.get_metric_values('valid_loss') == [0.25, 0.125]
    assert h2.get_metric_steps('valid_loss') == [0, 4] and h2.get_latest_metric('grad_norm', per='batch') == 2.
    with pytest.raises(ValueError, match="state_dict"): h2.load_state_dict([1, 2])

def test_trainer_owns_a_history_that_a_new_fit_keeps():
    class Record(Callback):
        def after_epoch(self, t):
            if not t.training: t.history.update_metric('epoch_seen', t.epoch)
    t = make_trainer([Record()])
    assert isinstance(t.history, RunHistory)
    t.fit(2); t.fit(1)
    assert t.history.get_metric_values('epoch_seen') == [0, 1, 0]
    t.history.reset()
    assert t.history.metric_names == []

def test_log_reaches_every_logger_with_numbers():
    a, b = Collect(), Collect()
    t = make_trainer([a, b])
    t.log({'lr': torch.tensor(0.25), 'note': 'x'})
    t.log({'gn': 1.5}, step=3, per='batch')
    assert a.logs == b.logs == [({'lr': 0.25, 'note': 'x'}, None, 'epoch'), ({'gn': 1.5}, 3, 'batch')]
    t.log_image('grid', torch.zeros(3, 8, 8), step=1)
    assert a.images == [('grid', (3, 8, 8), 1)]
    with pytest.raises(TypeError, match="dict"): t.log([0.1])
    with pytest.raises(ValueError, match="'epoch' or 'batch'"): t.log({'a': 1}, per='step')

def test_misspelled_log_hooks_are_reported():
    class Bad(Callback):
        def log_imag(self, trainer, name, image, step): pass
    with pytest.raises(AttributeError, match="log_image"): make_trainer([Bad()])

# ---------------------------------------------------------------- MetricsCB writes the history
from types import SimpleNamespace
from torch import nn
import torcheval.metrics as tem
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB

def cls_dls(n=200, bs=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g); y = (x[:, 0] - x[:, 2] > 0).long()
    batches = [(x[i:i+bs], y[i:i+bs]) for i in range(0, n, bs)]
    return SimpleNamespace(train=batches[:4], valid=batches[4:])

def cls_trainer(*cbs, **metrics_kw):
    torch.manual_seed(0)
    return Trainer(cls_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, nn.Linear(4, 2),
                   callbacks=[BasicTrainCB(), MetricsCB(**metrics_kw), *cbs])

def test_metrics_cb_writes_losses_and_metrics_per_epoch_and_logs_them():
    got = Collect()
    t = cls_trainer(got, acc=tem.MulticlassAccuracy())
    t.fit(3, lr=0.1)
    m, h = t.MetricsCB, t.history
    assert h.metric_names == ['train_loss', 'valid_loss', 'acc']
    assert h.get_metric_values('train_loss') == [r['train'] for r in m.losses_epoch]
    assert h.get_metric_values('valid_loss') == [r['valid'] for r in m.losses_epoch]
    assert h.get_metric_values('acc') == [r['acc'] for r in m.metrics_epoch]
    assert h.get_metric_values('valid_loss', per='batch') == [r['loss'] for r in m.losses_batch if not r['training']]
    assert len(h.get_metric_values('train_loss', per='batch')) == 3 * 4
    assert got.logs == [({'train_loss': h.get_metric_values('train_loss')[e], 'valid_loss': h.get_metric_values('valid_loss')[e],
                          'acc': h.get_metric_values('acc')[e]}, e, 'epoch') for e in range(3)]

def test_a_second_fit_and_a_new_metrics_cb_go_on_at_the_next_step():
    t = cls_trainer()
    t.fit(2, lr=0.1)
    t.fit(1, lr=0.1, valid=False)                       # a row with the train loss only
    t.remove_callbacks(t.MetricsCB)
    t.fit(1, lr=0.1, callbacks=MetricsCB(acc=tem.MulticlassAccuracy()))  # a new MetricsCB, for this fit only
    h = t.history
    assert h.get_metric_steps('train_loss') == [0, 1, 2, 3]
    assert h.get_metric_steps('valid_loss') == [0, 1, 3]
    assert h.get_metric_steps('acc') == [3]
    assert h.to_dataframe().index.tolist() == [0, 1, 2, 3]

def test_train_metrics_are_computed_on_the_training_pass_under_their_own_name():
    "With lr=0 the model does not change, so the training-pass accuracy is that of the fixed model on the training batches"
    t = cls_trainer(acc=tem.MulticlassAccuracy(), train_metrics=True)
    t.fit(2, lr=0.)
    with torch.no_grad():
        acc = lambda bs: torch.cat([(t.model(x).argmax(1) == y) for x, y in bs]).float().mean().item()
        train_acc, valid_acc = acc(t.dls.train), acc(t.dls.valid)
    h = t.history
    assert h.metric_names == ['train_loss', 'train_acc', 'valid_loss', 'acc']
    assert h.get_metric_values('train_acc') == pytest.approx([train_acc] * 2)
    assert h.get_metric_values('acc') == pytest.approx([valid_acc] * 2)
    assert train_acc != valid_acc
    assert t.MetricsCB.metrics_epoch[-1] == pytest.approx({'train_acc': train_acc, 'acc': valid_acc})

def test_metrics_cb_refuses_what_is_not_a_metric():
    with pytest.raises(TypeError, match="update"): MetricsCB(acc='accuracy')
    with pytest.raises(TypeError, match="another name"): MetricsCB(train_metrics=tem.MulticlassAccuracy())

def test_a_value_at_the_last_step_again_replaces_it():
    h = RunHistory()
    h.update_metric('acc', 0.5, step=0); h.update_metric('acc', 0.6, step=0); h.update_metric('acc', 0.7)
    assert h.get_metric_values('acc') == [0.6, 0.7] and h.get_metric_steps('acc') == [0, 1]

def test_two_metrics_cbs_record_an_epoch_at_one_step():
    t = cls_trainer()
    t.add_callbacks(MetricsCB(acc=tem.MulticlassAccuracy()))
    t.fit(2, lr=0.1)
    h = t.history
    assert h.get_metric_steps('train_loss') == h.get_metric_steps('acc') == [0, 1]
    assert h.get_metric_values('valid_loss') == [r['valid'] for r in t.MetricsCB.losses_epoch]
