"""MetricsCB in a distributed fit (torchrun, 2 CPU processes, gloo): the losses and metrics of each pass are those of the whole data,
on every process, equal to one process's over the same data; with DistributedDataParallel, with FSDPCB, and with AccelerateCB (which
gathers the validation predictions itself: MetricsCB must not count them twice)."""
import sys
from pathlib import Path
import pytest, torch
from torch import nn

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import dist_metrics_run as dm
import torchrun_cases
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB

TORCHRUN_CASES = HERE/'dist_metrics_run.py', {c: [c] for c in ('ddp', 'fsdp', 'accel', 'resume')}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/dist_metrics_run.py: those the selected tests use run in one torchrun launch (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

def reference():
    "The same fit on this one process, 16 samples a batch: its per-epoch history"
    m = dm.metrics()
    m.metrics['hits'] = dm.Hits()
    t = Trainer(dm.loaders(1), nn.CrossEntropyLoss(), torch.optim.SGD, dm.make_model(), callbacks=[BasicTrainCB(), m])
    t.fit(2, lr=0.1)
    return dm.records(t)

@pytest.mark.parametrize('how', ['ddp', 'fsdp', 'accel'])
@torchrun_cases.uses('ddp', 'fsdp', 'accel')
def test_every_process_records_the_metrics_of_the_whole_data(cases, how):
    """Both processes record the same train and valid losses, accuracies (torcheval's merged, torchmetrics' synced by itself, the
    training pass's too) as one process over the same data, to float rounding. Before, each process recorded its own half: rank 0's
    valid loss after epoch 0 was 1.42515 and rank 1's 1.43746 where one process's is 1.43131 (DDP; now 1.4313086 on both), and
    rank 0's accuracy 0.2222 for 0.2778. A metric that cannot
    be merged (no `merge_state`, not torchmetrics) keeps each process's own value, and a warning says so"""
    if how == 'accel': pytest.importorskip('accelerate')
    r0, r1 = cases(how)
    ref = reference()
    h0, h1 = r0['history'], r1['history']
    assert sorted(h0) == sorted(ref) == ['acc', 'hits', 'seen', 'tm', 'train_acc', 'train_loss', 'train_seen', 'train_tm', 'valid_loss']
    assert ref['seen'] == [36., 36.] and ref['train_seen'] == [64., 64.] and h0['seen'] == ref['seen'] and h0['train_seen'] == ref['train_seen']
    for name in ('train_loss', 'valid_loss', 'acc', 'tm', 'train_acc', 'train_tm'):
        assert h0[name] == h1[name], (name, h0[name], h1[name])
        assert torch.allclose(torch.tensor(h0[name]), torch.tensor(ref[name]), atol=1e-5, rtol=1e-5), (name, h0[name], ref[name])
    assert h0['acc'] == ref['acc']  # (counts agree exactly)
    if how == 'accel':  # every process computed the validation metrics on every process's predictions: whole already
        assert h0['hits'] == h1['hits'] == ref['hits'] and r0['warnings'] == r1['warnings'] == []
        return
    assert h0['hits'] != ref['hits'] and sum(h0['hits']) + sum(h1['hits']) == sum(ref['hits'])  # each process's own count
    for r in (r0, r1):
        assert len(r['warnings']) == 1 and "metric 'hits' (Hits) cannot be combined across the 2 processes" in r['warnings'][0], r['warnings']

@torchrun_cases.uses('resume')
def test_a_distributed_fit_resumed_inside_a_pass_records_the_uninterrupted_figures(cases):
    """DDP, a checkpoint file every 3 steps (the main process writes it): resumed from the one of step 6, in the middle of epoch 1's
    training pass, the fit records the uninterrupted fit's figures exactly, on both processes. Every process saves the checkpoint
    (CheckpointCB runs on all), and MetricsCB gathers every process's pass so far into it; each resumes its own. Without the gather
    the checkpoint held the main process's pass only, which both processes resumed as their own: epoch 1's train loss counted rank
    0's first 2 batches twice and rank 1's not at all"""
    r0, r1 = cases('resume')
    for r in (r0, r1):
        assert r['resumed'] == r['history'], (r['resumed'], r['history'])
        assert r['resumed_warnings'] == [] and len(r['history']['train_loss']) == 2
    assert r0['history'] == r1['history']
