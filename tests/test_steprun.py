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
