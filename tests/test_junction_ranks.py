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

def launch(out, case): return torchrun_cases.launch(HERE/'junction_run.py', out, case)

def test_lsuvinitcb_starts_every_process_from_rank_0s_initialisation(tmp_path):
    """Every parameter equal on both processes after the initialisation and a step (the BatchNorm's running statistics are each
    process's own under DDP, as always). Before: each process rescaled the layers on its own first batch, and DDP trained from two
    different models: the weights differed by up to 0.0572 (the first layer's bias; 0.0417 its weight, 0.0526 the last layer's)"""
    r0, r1 = launch(tmp_path, 'lsuv')
    assert 'result' in r0 and 'result' in r1, (r0, r1)
    params = [k for k in r0['result'] if not k.split('.')[-1].startswith(('running_', 'num_batches'))]
    assert len(params) == 6
    diff = max((torch.tensor(r0['result'][k]) - torch.tensor(r1['result'][k])).abs().max().item() for k in params)
    assert diff == 0, diff
