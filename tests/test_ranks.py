"""Processes that agree (`aisaac.ranks`), on 2 CPU processes (torchrun, gloo, DistributedDataParallel): a stop decided on one process
ends the fit on both at the same batch, and an error on one ends both at once (well before the gloo timeout, while the failed one is alive), naming it. Without the agreements each case
hangs: `ranks_run.py ... plain` shows it (the processes wait for each other until the gloo timeout)."""
from pathlib import Path
import pytest
import torchrun_cases

HERE = Path(__file__).parent

TORCHRUN_CASES = HERE/'ranks_run.py', {c: [c] for c in ('cancel', 'early', 'epoch', 'error', 'preempt', 'loader', 'refuse_all', 'loader_end', 'one_batch', 'one_batch_error', 'one_batch_accum', 'accum_cancel')}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/ranks_run.py: all those the selected tests use run in one torchrun launch (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

# "At once": a process that waits for the other at a collective waits until the gloo timeout (60 s in ranks_run.py), and a failed
# process stays alive for ranks_run.WAIT (45) s waiting for the other's end; the ends are checked by that order (`other_ended_first`),
# and a stop or a failure must reach the other process well under both, whatever the load
AT_ONCE = 40

@torchrun_cases.uses('cancel')
def test_a_stop_on_rank_0_before_the_step_ends_both_without_stepping(cases):
    "Rank 0 raises CancelFitException in `after_loss` of the 4th batch: both end with 3 optimizer steps and the same weights"
    r0, r1 = cases('cancel')
    for r in (r0, r1): assert (r['outcome'], r['steps'], r['epoch'], r.get('error')) == ('cancelled', 3, 0, None)
    assert r0['weights'] == r1['weights']
    assert r0['exception'] == 'CancelFitException: rank 0 stops'
    assert r1['exception'] == 'CancelFitException: CancelFitException raised on rank 0 in RaiseAt.after_loss: rank 0 stops'
    assert r1['ended'] - r0['raised_at'] < AT_ONCE

@torchrun_cases.uses('early')
def test_early_stopping_on_rank_0_only_stops_both_after_the_same_epoch(cases):
    "Rank 0's metric gets worse after epoch 0, rank 1's better: EarlyStoppingCB stops rank 0 after epoch 1, and rank 1 with it"
    r0, r1 = cases('early')
    for r in (r0, r1): assert (r['outcome'], r['steps'], r['epoch'], r.get('error')) == ('cancelled', 16, 1, None)
    assert r0['weights'] == r1['weights']
    assert r0['stop_reason'].startswith('EarlyStoppingCB: score has not improved')
    assert r1['stop_reason'] == r0['stop_reason'] + ' (on rank 0)'

@torchrun_cases.uses('epoch')
def test_a_pass_cancelled_on_rank_1_ends_that_pass_on_both(cases):
    "Rank 1 raises CancelEpochException after the 2nd step: both end epoch 0's training pass there, then train 2 more epochs"
    r0, r1 = cases('epoch')
    for r in (r0, r1): assert (r['outcome'], r['steps'], r['epoch'], r.get('error')) == ('ok', 2 + 2 * 8, 2, None)
    assert r0['weights'] == r1['weights']

@torchrun_cases.uses('error')
def test_an_error_on_rank_1_ends_rank_0_at_once_naming_it(cases):
    "Rank 1 raises ValueError in `after_loss`: held, it ends both at the agreement before the step, although rank 1 goes on afterwards"
    r0, r1 = cases('error')
    assert (r1['outcome'], r1['error']) == ('error', 'ValueError: a bad batch on rank 1')
    assert (r0['outcome'], r0['error']) == ('error', 'ProcessFailedError: rank 1 failed: ValueError: a bad batch on rank 1')
    assert r0['steps'] == r1['steps'] == 3
    assert r1['other_ended_first'] and r0['ended'] - r1['raised_at'] < AT_ONCE

@torchrun_cases.uses('preempt')
def test_a_preemption_notice_on_rank_1_alone_checkpoints_and_ends_both_at_the_same_batch(cases):
    """Only rank 1 gets SIGTERM, in the 4th batch: the notice is agreed before that batch's step, so both take the step, rank 0 (the
    main process) writes the checkpoint of that point, and both end as 'preempted'. Before, rank 1 alone stopped and rank 0, which
    writes the checkpoints, wrote none"""
    r0, r1 = cases('preempt')
    for r in (r0, r1): assert (r['outcome'], r['steps'], r['epoch'], r.get('error')) == ('preempted', 4, 0, None)
    assert r0['weights'] == r1['weights']
    assert r0['checkpoints'] == r1['checkpoints'] == ['checkpoint_0000_000004.pt']
    import torch
    state = torch.load(cases.out('preempt')/'ckpt'/'checkpoint_0000_000004.pt', weights_only=True)
    assert (state['epoch'], state['batch']) == (0, 4)

@torchrun_cases.uses('loader')
def test_an_error_outside_the_handlers_on_rank_1_ends_rank_0_naming_it(cases):
    """Rank 1's validation loader raises OSError, which no handler holds, and rank 1 goes on: rank 0, waiting at its next agreement,
    stops waiting when rank 1 closes the agreements' group and names rank 1's error (posted in the store), within seconds"""
    r0, r1 = cases('loader')
    assert (r1['outcome'], r1['error']) == ('error', 'OSError: the disk is gone on rank 1')
    assert (r0['outcome'], r0['error']) == ('error', 'ProcessFailedError: rank 1 failed: OSError: the disk is gone on rank 1')
    assert r0['steps'] == r1['steps'] == 8
    assert r1['other_ended_first'] and r0['ended'] - r1['raised_at'] < AT_ONCE

@torchrun_cases.uses('refuse_all')
def test_when_every_process_refuses_a_fit_each_raises_its_own_error_every_time(cases):
    """Every process raises TypeError in `before_fit`, 20 fits in a row: the agreement picks rank 0's, and each process raises its own
    TypeError every time. Before, the store's first poster won afterwards: rank 0 raised `ProcessFailedError('rank 1 failed: ...')` in
    about half of the fits (11 of 20 here), rank 1 `'rank 0 failed'` in others, at random"""
    r0, r1 = cases('refuse_all')
    assert r0['errors'] == ['TypeError: refused on rank 0'] * 20, r0['errors']
    assert r1['errors'] == ['TypeError: refused on rank 1'] * 20, r1['errors']

@torchrun_cases.uses('loader_end')
def test_an_error_at_the_end_of_rank_1s_loader_ends_rank_0_waiting_for_the_epochs_metrics(cases):
    """Rank 1's validation loader raises OSError at its end, after the last batch (the pass's last agreement is behind), outside any
    handler; rank 0 goes on to `after_epoch`, where MetricsCB gathers the pass's figures from both processes. Rank 1 does not come:
    its fit ends, closing the fit's own group (`_fit_group`), so rank 0 stops waiting within seconds and names rank 1's error. (In
    the process-wide `_small_group`, which no failing fit closes, rank 0 waited there until rank 1's process exited)"""
    r0, r1 = cases('loader_end')
    assert (r1['outcome'], r1['error']) == ('error', 'OSError: the disk is gone on rank 1')
    assert (r0['outcome'], r0['error']) == ('error', 'ProcessFailedError: rank 1 failed: OSError: the disk is gone on rank 1'), r0
    assert r0['steps'] == r1['steps'] == 8
    assert r1['other_ended_first'] and r0['ended'] - r1['raised_at'] < AT_ONCE

@torchrun_cases.uses('one_batch')
def test_one_batch_on_two_processes_ends_with_the_first_batch_as_on_one(cases):
    """OneBatchCB raises its stop in `cleanup_batch`, after the step: it says at `before_step` that the fit ends with the batch
    (`stops_after_batch`), so the processes agree at that batch's end. Before (the invariance harness's KNOWN entry), the stop waited
    for the next batch's `before_step`: both ran a second forward and backward, and the clock counted 16 samples against one global batch's 8"""
    r0, r1 = cases('one_batch')
    for r in (r0, r1): assert (r['outcome'], r['steps'], r['samples'], r['epoch'], r.get('error')) == ('cancelled', 1, 8, 0, None)
    assert r0['weights'] == r1['weights']

@torchrun_cases.uses('one_batch_error')
def test_an_error_after_the_step_of_the_last_batch_ends_both_at_its_end_naming_it(cases):
    "Rank 1 raises ValueError in `after_batch` of the batch OneBatchCB ends the fit with: held to the agreement at that batch's end, it ends both there"
    r0, r1 = cases('one_batch_error')
    assert (r1['outcome'], r1['error']) == ('error', 'ValueError: a bad batch end on rank 1')
    assert (r0['outcome'], r0['error']) == ('error', 'ProcessFailedError: rank 1 failed: ValueError: a bad batch end on rank 1')
    assert r0['steps'] == r1['steps'] == 1 and r0['samples'] == r1['samples'] == 8

@torchrun_cases.uses('one_batch_accum')
def test_one_batch_under_accumulation_ends_with_the_first_micro_batch_on_both(cases):
    """OneBatchCB under GradAccumCB(2): the first micro-batch's step is skipped before `before_step`'s agreement, so `RanksCB` agrees at
    its `step_skipped` and asks `stops_after_batch` there. Before, the stop waited for the window's step batch: 16 samples against 8, one step"""
    r0, r1 = cases('one_batch_accum')
    for r in (r0, r1): assert (r['outcome'], r['steps'], r['samples'], r['epoch'], r.get('error')) == ('cancelled', 0, 8, 0, None)
    assert r0['weights'] == r1['weights']

@torchrun_cases.uses('accum_cancel')
def test_a_stop_in_a_window_ends_both_at_that_micro_batch(cases):
    "Rank 1 raises CancelFitException in the first micro-batch of a window: agreed at that batch's `step_skipped`, no process runs the second"
    r0, r1 = cases('accum_cancel')
    for r in (r0, r1): assert (r['outcome'], r['steps'], r['samples'], r.get('error')) == ('cancelled', 0, 8, None), r
    assert r0['weights'] == r1['weights']
