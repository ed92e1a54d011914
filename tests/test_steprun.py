"A run measured in steps (`fit(steps=..., valid_every=...)`): the monitors' values on the step axis (whole CSV rows), the CSV's first column, checkpoint names by step, and `summarize_model` on a language model's dict batches"
import csv, json
import pytest
import torch
from tiny import make_trainer
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.loggers import CSVLogger, JSONLinesLogger
from aisaac.callbacks.monitors import LRMonitorCB, SpeedMonitorCB, RuntimeEstimatorCB, GradNormCB, MemoryMonitorCB
from aisaac.callbacks.savers import CheckpointCB, checkpoints, last_checkpoint
import aisaac.callbacks.summary  # `trainer.summarize_model`


def monitors(): return [SpeedMonitorCB(window_size=2), MemoryMonitorCB(every_n_batches=1), RuntimeEstimatorCB(), LRMonitorCB(), GradNormCB(per_layer=False)]

def read_csv(p):
    with open(p, newline='') as f: return list(csv.reader(f))


def test_a_step_runs_interval_values_land_on_the_rows_of_its_losses(tmp_path):
    "Each `valid_every` interval gives one whole row, numbered by the optimizer step it ends at, as the losses are"
    t = make_trainer([MetricsCB(show=False), *monitors(), CSVLogger(tmp_path/'e.csv'), JSONLinesLogger(tmp_path/'l.jsonl')], n_train=(3,) * 5)
    t.fit(steps=8, valid_every=4, lr=0.01)
    head, *rows = read_csv(tmp_path/'e.csv')
    assert head[0] == 'step' and {'train_loss', 'valid_loss', 'epoch_samples_per_sec', 'train_time', 'rss_mib'} <= set(head)
    assert [r[0] for r in rows] == ['4', '8'] and all(all(v != '' for v in r) for r in rows), rows  # two whole rows
    interval_lines = [l for l in map(json.loads, (tmp_path/'l.jsonl').read_text().splitlines()) if l['per'] == 'interval']
    assert {l['step'] for l in interval_lines} == {4, 8}
    for name in ('train_time', 'rss_mib', 'valid_loss'): assert t.history.get_metric_steps(name) == [4, 8], name


def test_a_step_runs_per_batch_values_share_one_row_per_batch(tmp_path):
    "The per-batch values of every monitor are numbered by the run's clock: a row per training batch, none half-empty"
    t = make_trainer([MetricsCB(show=False), CSVLogger(tmp_path/'b.csv', per='batch')], n_train=(3,) * 5)
    t.fit(steps=4, valid_every=2, lr=0.01)  # the clock is at step 4 when the monitors come in
    t.fit(steps=6, valid_every=3, lr=0.01, callbacks=monitors())
    head, *rows = read_csv(tmp_path/'b.csv')
    assert head[0] == 'batch' and [r[0] for r in rows] == [str(i) for i in range(4, 10)], rows
    cols = {n: [r[i] for r in rows] for i, n in enumerate(head)}
    for n in ('lr', 'grad_norm', 'rss_mib'): assert '' not in cols[n], n
    assert '' not in cols['samples_per_sec'][1:]  # the window of 2 is full from the second batch on


def test_an_epoch_runs_csv_keeps_its_epoch_column(tmp_path):
    t = make_trainer([MetricsCB(show=False), SpeedMonitorCB(), CSVLogger(tmp_path/'e.csv')])
    t.fit(2, lr=0.01)
    head, *rows = read_csv(tmp_path/'e.csv')
    assert head[0] == 'epoch' and [r[0] for r in rows] == ['0', '1'] and all('' not in r for r in rows)


def test_a_step_runs_checkpoints_are_named_by_the_global_step(tmp_path):
    t = make_trainer([MetricsCB(show=False), CheckpointCB(tmp_path, every='2 steps', keep_last=None)], n_train=(3,) * 5)
    t.fit(steps=8, valid_every=4, lr=0.01)
    assert [p.name for p in checkpoints(tmp_path)] == [f'checkpoint_step_{s:06d}.pt' for s in (2, 4, 6, 8)]  # step 4's, after validation, replaces the one before
    assert last_checkpoint(tmp_path).name == 'checkpoint_step_000008.pt'
    # a second fit resumes from step 4 and goes on to step 8 as the first did
    t2 = make_trainer([MetricsCB(show=False)], n_train=(3,) * 5)
    t2.fit(steps=8, valid_every=4, lr=0.01, resume_from=tmp_path/'checkpoint_step_000004.pt')
    assert t2.clock.step == 8 and t2.history.get_metric_values('valid_loss') == pytest.approx(t.history.get_metric_values('valid_loss'))


def test_epoch_runs_keep_their_names_and_older_names_still_load_and_count(tmp_path):
    t = make_trainer([MetricsCB(show=False), CheckpointCB(tmp_path, keep_last=None)])
    t.fit(2, lr=0.01)
    assert [p.name for p in checkpoints(tmp_path)] == ['checkpoint_0001_000000.pt', 'checkpoint_0002_000000.pt']
    old = tmp_path/'checkpoint_0000_000004.pt'  # a step run's checkpoint named as aisaac named them before
    s = make_trainer([MetricsCB(show=False), CheckpointCB(tmp_path, every='2 steps', keep_last=3)], n_train=(3,) * 5)
    s.fit(steps=4, valid_every=4, lr=0.01)
    (tmp_path/'checkpoint_step_000004.pt').rename(old)
    assert last_checkpoint(tmp_path) == old  # the newest, whatever its name
    r = make_trainer([MetricsCB(show=False), CheckpointCB(tmp_path, every='2 steps', keep_last=3)], n_train=(3,) * 5)
    r.fit(steps=8, valid_every=4, lr=0.01, resume_from=last_checkpoint(tmp_path))
    assert r.clock.step == 8 and last_checkpoint(tmp_path).name == 'checkpoint_step_000008.pt'
    assert [p.name for p in checkpoints(tmp_path)] == ['checkpoint_0000_000004.pt', 'checkpoint_step_000006.pt', 'checkpoint_step_000008.pt']


# ------------------------------------------------------------------------------------------------ summarize_model on a language model

def lm_trainer(n_layer=2, d_model=32, T=16, vocab=64, B=4, **kw):
    import types
    from aisaac.models import GPT
    from aisaac.trainer import Trainer
    from aisaac.callbacks.train import BasicTrainCB
    g = torch.Generator().manual_seed(0)
    def batch():
        ids = torch.randint(0, vocab, (B, T + 1), generator=g)
        return {'input_ids': ids[:, :-1], 'labels': ids[:, 1:]}
    torch.manual_seed(0)
    model = GPT(vocab, n_layer=n_layer, n_head=2, d_model=d_model, block_size=T)
    return Trainer(types.SimpleNamespace(train=[batch(), batch()], valid=[batch()]), None, torch.optim.AdamW, model, callbacks=[BasicTrainCB(**kw)])


def test_summarize_model_reads_a_dict_batch_as_the_trainer_does_and_counts_flops_per_token():
    L, d, T, V, B = 2, 32, 16, 64, 4
    t = lm_trainer(L, d, T, V, B)
    s = t.summarize_model()  # was KeyError: 0
    n = sum(p.numel() for p in t.model.parameters())
    assert s.params == n and s.tokens == B * T
    # the forward pass's matrix products per token: 2 x (12 d^2 per block + the tied head's V d) + attention's 4 T d per block
    assert s.flops == B * T * (2 * (12 * d * d * L + V * d) + 4 * L * T * d)
    assert s.flops_per_token == s.flops / (B * T) and s.train_flops_per_token == 3 * s.flops_per_token
    # the usual estimate: 6N + 12 n_layer d_model T, N the parameters without the position embeddings (looked up, not multiplied)
    N = n - T * d
    assert s.estimate_flops_per_token == 6 * N + 12 * L * d * T
    assert abs(s.estimate_flops_per_token / s.train_flops_per_token - 1) < 0.05  # biases and layer norms: the estimate's only extra
    text = repr(s)
    assert 'per token' in text and 'tokens per batch' in text.lower()


def test_summarize_model_passes_the_inputs_the_trainers_train_callback_names():
    "`BasicTrainCB(input_keys='input_ids')` with a `loss_func`: the model gets `input_ids` alone, as in training"
    from aisaac.models import lm_loss
    t = lm_trainer(input_keys='input_ids')
    t.loss_func = lm_loss
    s = t.summarize_model()
    assert s.tokens == 4 * 16 and s.flops > 0
    bad = lm_trainer(input_keys='ids')
    bad.loss_func = lm_loss
    with pytest.raises(KeyError, match='input_keys'): bad.summarize_model()  # the trainer's own error: the batch has no `ids`


def test_summarize_model_on_an_image_batch_reports_no_tokens():
    t = make_trainer()
    s = t.summarize_model()
    assert s.tokens == 0 and s.flops_per_token is None and 'per token' not in repr(s)


def test_in_a_step_run_epoch_numbers_the_intervals_and_the_clock_counts_the_loaders_epochs():
    "As 21_clock says: `trainer.epoch` is the interval of `valid_every` steps, `n_epochs` their number, `clock.epoch` the loader's epochs"
    from aisaac.core.callback import Callback
    class Seen(Callback):
        def before_fit(self, t): self.epochs = []
        def before_epoch(self, t):
            if t.training: self.epochs.append((t.epoch, t.clock.step, t.clock.epoch))
    t = make_trainer([seen := Seen()], n_train=(3,) * 4)  # 4 batches a loader epoch
    t.fit(steps=10, valid_every=4, lr=0.01)
    assert seen.epochs == [(0, 0, 0), (1, 4, 0), (2, 8, 1)]  # an epoch of the loader is counted when the next one starts and t.n_epochs == 3 and (t.clock.epoch, t.clock.step) == (2, 10)
