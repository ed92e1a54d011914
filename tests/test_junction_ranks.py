"""Callbacks meeting several processes (torchrun, 2 CPU processes, gloo): `LSUVInitCB` starts every process from rank 0's
initialisation; `CapturePredsCB` and `ItemLossesCB` join the processes' items (also when the fit ends early), with tuple or dict batches,
and give what one process gives over the same data (issue 51, the processes invariant)."""
import sys
from pathlib import Path
import pytest, torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import junction_run as jr
import torchrun_cases

TORCHRUN_CASES = HERE/'junction_run.py', {c: [c] for c in ('lsuv', 'preds', 'preds_dict', 'preds_early', 'lm', 'preds_resume')}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/junction_run.py: the cases the selected tests use run in one torchrun launch (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

@torchrun_cases.uses('lsuv')
def test_lsuvinitcb_starts_every_process_from_rank_0s_initialisation(cases):
    """Every parameter equal on both processes after the initialisation and a step (the BatchNorm's running statistics are each
    process's own under DDP, as always). Before: each process rescaled the layers on its own first batch, and DDP trained from two
    different models: the weights differed by up to 0.0572 (the first layer's bias; 0.0417 its weight, 0.0526 the last layer's)"""
    r0, r1 = cases('lsuv')
    assert 'result' in r0 and 'result' in r1, (r0, r1)
    params = [k for k in r0['result'] if not k.split('.')[-1].startswith(('running_', 'num_batches'))]
    assert len(params) == 6
    diff = max((torch.tensor(r0['result'][k]) - torch.tensor(r1['result'][k])).abs().max().item() for k in params)
    assert diff == 0, diff

def reference(case):
    "The same on one process, 8 samples a batch"
    import torch.distributed as dist
    return jr.run(case, 1)

def close(a, b): return torch.allclose(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), atol=1e-6)

@pytest.mark.parametrize('case', ['preds', 'preds_dict', 'preds_early'])
@torchrun_cases.uses('preds', 'preds_dict', 'preds_early')
def test_captured_predictions_and_item_losses_join_every_process_in_the_loaders_order(cases, case):
    """`capture_preds`, `Interpretation.from_trainer` (the whole validation set) and `CapturePredsCB`/`ItemLossesCB` in a fit cancelled after
    the 2nd batch give, on both processes, what one process gives over the same 30 items: every prediction, target, input and item
    loss in the loader's order, the same items of largest loss. Before: each process kept its own 15 items (8 after the cancel, none
    at all: the join was in `after_fit`, which a cancel skips), numbered from 0 on each; dict batches failed with `KeyError: 0`"""
    ref = reference(case)
    r0, r1 = cases(case)
    for r in (r0, r1):
        assert 'result' in r, r
        got = r['result']
        assert got['preds'] is not None and len(got['preds']) == len(ref['preds']) == (16 if case == 'preds_early' else 30)
        for k in ('preds', 'targs', 'losses'): assert close(got[k], ref[k]), k
        inps = got['inps'] if case != 'preds_dict' else got['inps']['x']
        assert close(inps, ref['inps'] if case != 'preds_dict' else ref['inps']['x'])
        assert got['top_idxs'] == ref['top_idxs']
        if case != 'preds_early': assert got['top'] == ref['top']

@torchrun_cases.uses('lm')
def test_two_processes_train_a_language_model_as_one(cases):
    """A token-weighted loss (`lm_loss`, the mean over the tokens not -100) under DDP: 2 processes of 2 padded sequences a batch train
    as one process on the global batch of 4, each token of the global batch counting once (float rounding). Before: each process's loss
    was the mean over its own tokens and DDP averaged the two means, so a process with fewer tokens weighed each more: after 8 steps
    the weights differed from one process's by up to 0.1448 (now below 1e-6)"""
    ref = reference('lm')
    r0, r1 = cases('lm')
    for r in (r0, r1):
        assert 'result' in r, r
        diff = max((torch.tensor(r['result'][k]) - torch.tensor(ref[k])).abs().max().item() for k in ref)
        assert diff < 1e-6, diff

@torchrun_cases.uses('preds_resume')
def test_a_fit_of_two_processes_resumed_from_a_checkpoint_captures_what_the_straight_one_does(cases, tmp_path):
    """CapturePredsCB and ItemLossesCB over 2 epochs of 2 processes, resumed from the first epoch's checkpoint: every prediction, target,
    input and item loss, and the same items of largest loss, as in the straight fit (the training predictions are not one process's:
    the model's BatchNorm normalises each process's share of the batch), and the items in one process's order, pass by pass (training
    and validation passes alternate: they were joined one process after the other, rank 1's first epoch after rank 0's second). Before:
    the checkpoint (written by the main process) held the main process's records alone (35 of 70 rows after the first epoch), and each
    process resumed them as its own: rank 1 ended with rank 0's first epoch"""
    ref = jr.resumed(tmp_path, 1)['straight']
    for r in cases('preds_resume'):
        assert 'result' in r, r
        straight, resumed = r['result']['straight'], r['result']['resumed']
        assert len(straight['preds']) == 140  # (2 epochs of 40 training and 30 validation items)
        for k in ('preds', 'targs', 'inps', 'losses'): assert close(resumed[k], straight[k]), k
        assert resumed['top_idxs'] == straight['top_idxs']
        assert straight['targs'] == ref['targs'] and close(straight['inps'], ref['inps'])  # (one process's order)
