"A run measured in steps (`fit(steps=..., valid_every=...)`): the monitors' values on the step axis (whole CSV rows), the CSV's first column, checkpoint names by step, and `summarize_model` on a language model's dict batches"
import csv, json
import pytest
import torch
from tiny import make_trainer
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.loggers import CSVLogger, JSONLinesLogger
from aisaac.callbacks.monitors import LRMonitorCB, SpeedMonitorCB, RuntimeEstimatorCB, GradNormCB, MemoryMonitorCB
from aisaac.callbacks.savers import CheckpointCB, checkpoints, last_checkpoint


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
    epoch_lines = [json.loads(l) for l in (tmp_path/'l.jsonl').read_text().splitlines() if '"epoch"' in l]
    assert {l['step'] for l in epoch_lines} == {4, 8}
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
