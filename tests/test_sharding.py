"""Sharded training (`aisaac.callbacks.sharding`) on 2 CPU processes (torchrun, gloo): a fit sharded with FSDP2 takes the same steps
as the same fit on one process with the same global batch; clipping clips the norm of the whole gradients; activation checkpointing
changes no number and keeps less memory; a fit refused on one process is refused on all, with the same message, without a hang."""
import json, subprocess, sys
from pathlib import Path
import pytest, torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import sharding_run as sr
import torchrun_cases
from aisaac.trainer import Trainer

LIMIT = 600  # seconds for one plain process of the memory test (a guard against a hang)

# The 2-process runs of tests/sharding_run.py the tests read: a name -> the script's arguments. All those the selected tests use run in
# one torchrun launch (`torchrun_cases.Cases`, with the other modules' cases), each in its own folder
TORCHRUN_CASES = HERE/'sharding_run.py', {'fit': ['fit'], 'clip': ['fit', 'clip', 'norm'], 'ac': ['fit', 'ac'], 'transaction': ['fit', 'transaction'], 'bf16': ['fit', 'bf16'],
         'offload': ['fit', 'offload'], 'refuse_ddp': ['refuse', 'ddp'], 'refuse_fsdp': ['refuse', 'fsdp'], 'accum': ['fit', 'accum'],
         'refuse_resume': ['refuse', 'fsdp', 'resume'], 'lrfind': ['lrfind']}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of `CASES`, by name (run on 2 processes, under `torchrun_cases.LIMIT`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

def reference(*opts):
    "The same fit on this one process, with the global batch: its losses, clipping norms and weights"
    model, cbs = sr.make_model(), sr.callbacks(opts)
    t = Trainer(sr.loaders(1), sr.lm_loss, torch.optim.AdamW, model, callbacks=cbs)
    t.fit(2, lr=1e-2)
    rec = cbs[1]
    return dict(losses=[float(l) for l in rec.losses], norms=rec.norms, clipped=rec.clipped, weights=sr.full_weights(model),
                grad_norm=t.history.get_metric_values('grad_norm', per='batch') if 'norm' in opts else None)

def close(a, b, tol=1e-5): return torch.allclose(torch.tensor(a), torch.tensor(b), atol=tol, rtol=tol)

@torchrun_cases.uses('fit')
def test_a_sharded_fit_takes_the_steps_of_the_unsharded_one(cases):
    "FSDPCB on 2 processes (AdamW, each process half the batch): every step's loss and the final weights are those of one process"
    r0, r1 = cases('fit')
    ref = reference()
    assert r0['param_type'] == 'DTensor' and r0['param_dtype'] == 'torch.float32'
    assert len(r0['losses']) == len(ref['losses']) == 8
    assert close(r0['losses'], ref['losses']), (r0['losses'], ref['losses'])
    assert r0['weights'] == r1['weights'] and close(r0['weights'], ref['weights'], 1e-4)  # (Adam divides by sqrt(v): a gradient
    # near 0 summed in another order moves its weight by a different part of lr = 1e-2; 1e-4 is 1% of one step)

@torchrun_cases.uses('clip')
def test_clipping_under_fsdp_clips_the_norm_of_the_whole_gradients(cases):
    """GradClipCB(0.05): the norm it clips is the norm of the whole gradients (the unsharded fit's), on both processes, and after it
    the whole gradients' norm is 0.05; GradNormCB records the same norms as on one process"""
    r0, r1 = cases('clip')
    ref = reference('clip', 'norm')
    assert close(r0['norms'], ref['norms']) and r0['norms'] == r1['norms']
    assert all(n > 0.5 for n in ref['norms'])  # every step is clipped
    assert close(r0['clipped'], [0.05] * 8, 1e-4)
    assert close(r0['grad_norm'], ref['grad_norm']) and close(r0['losses'], ref['losses']) and close(r0['weights'], ref['weights'], 1e-4)

@torchrun_cases.uses('fit', 'ac')
def test_activation_checkpointing_under_fsdp_changes_no_number(cases):
    "FSDPCB with ActivationCheckpointCB: the same losses and weights as FSDPCB alone, bit for bit"
    a, _ = cases('fit')
    b, _ = cases('ac')
    assert a['losses'] == b['losses'] and a['weights'] == b['weights']

@torchrun_cases.uses('transaction')
def test_a_transaction_puts_back_the_sharded_weights(cases):
    "A fit inside `trainer.transaction()` on DTensor parameters: the whole weights are as before it, and the next fit trains"
    r0, r1 = cases('transaction')
    assert r0['restored'] and r1['restored']
    assert len(r0['losses']) == 8 + 4  # the recorder's 4 losses of the fit inside the transaction are put back with its attributes

@torchrun_cases.uses('bf16', 'offload')
def test_mixed_precision_trains_and_cpu_offload_is_refused_without_a_gpu(cases):
    """bf16 parameters with fp32 reduction: the sharded parameters stay fp32, the loss goes down, near the fp32 one. CPU offload moves
    shards from a GPU: without one it is refused on both processes, naming why"""
    r0, _ = cases('bf16')
    ref = reference()
    assert r0['param_dtype'] == 'torch.float32'
    assert r0['losses'][-1] < r0['losses'][0]
    assert close(r0['losses'], ref['losses'], 0.05) and not close(r0['losses'], ref['losses'], 1e-5)
    r0, r1 = cases('offload')
    assert r0['error'].startswith('ValueError: cpu_offload=True moves the shards from the GPU') and r1['error'] == r0['error']

@pytest.mark.parametrize('how', ['ddp', 'fsdp'])
@torchrun_cases.uses('refuse_ddp', 'refuse_fsdp')
def test_a_refusal_on_one_process_is_raised_on_all(cases, how):
    """A callback needs what a main-only callback provides: rank 1, where that one is switched off, refuses the fit. Before, rank 0
    waited for rank 1 at the fit's first agreement until the gloo timeout; now both raise the same ValueError, at once"""
    r0, r1 = cases(f'refuse_{how}')
    assert r1['error'].startswith("ValueError: NeedsMain needs 'main_value', which ")
    assert r0['error'] == r1['error']
    assert 'ProvidesMain provides it but runs on the main process only' in r1['error']
    assert 'raised on rank 1 before the fit started: every process refuses the fit' in r0['notes']
    assert r0['seconds'] < 20 and r1['seconds'] < 20

def test_activation_checkpointing_changes_no_number_and_keeps_less_memory(tmp_path):
    """One process each (no torchrun), a GPT of 8 blocks with long sequences, 2 SGD steps: with ActivationCheckpointCB the losses are
    bit-identical, and the peak resident memory (`VmHWM` of the process) is lower by tens of MiB, the activations it did not keep"""
    res = {}
    for opt in ('', 'ac'):
        subprocess.run([sys.executable, str(HERE/'sharding_run.py'), str(tmp_path), 'memory', *([opt] if opt else [])], check=True, timeout=LIMIT)
        res[opt] = json.loads((tmp_path/f'memory{"_" + opt if opt else ""}.json').read_text())
    assert res['ac']['losses'] == res['']['losses'] and len(res['']['losses']) == 2
    assert res['ac']['maxrss_mib'] < res['']['maxrss_mib'] - 20, res

@torchrun_cases.uses('accum')
def test_accumulation_under_fsdp_reduces_once_per_step_and_equals_the_large_batch(cases):
    """GradAccumCB(2) with half the batch, `trainer.sync_gradients` True on every 2nd batch (as GradAccumCB sets it): FSDPCB skips the
    reduce-scatter of the 1st batch's backward (no sharded gradient yet) and the 2nd reduces the sum; the steps are the large batch's"""
    r0, r1 = cases('accum')
    ref = reference()
    assert r0['reduced'] == [False, True] * 8 and r1['reduced'] == r0['reduced']
    pairs = torch.tensor(r0['losses']).view(8, 2).mean(1).tolist()  # the two half batches of each step
    assert close(pairs, ref['losses']) and close(r0['weights'], ref['weights'], 1e-4)

@torchrun_cases.uses('refuse_resume')
def test_a_refusal_in_the_checks_of_fit_on_one_process_is_raised_on_all(cases):
    """Rank 1 alone resumes from a file that is not there: `check_fit` refuses it there, before any callback is added. Before, rank 0
    went on to its first collective and waited past any limit; now it raises the same FileNotFoundError, noted, at once"""
    r0, r1 = cases('refuse_resume')
    assert r1['error'] == f"FileNotFoundError: No checkpoint at {cases.out('refuse_resume')/'missing.pt'}" and r0['error'] == r1['error']
    assert r0['notes'] == ['raised on rank 1 before the fit started: every process refuses the fit']
    assert r0['seconds'] < 20

@torchrun_cases.uses('lrfind')
def test_lr_find_under_fsdp_gives_both_processes_the_same_suggestion_and_puts_the_weights_back(cases):
    """`lr_find` with FSDPCB on 2 processes, before the first fit (FSDPCB shards the model in the sweep) and after one: both processes
    record the same curve (the mean of their losses) and get the same suggestion; the whole weights after the sweep are those before
    it (a sweep that sharded the model puts the whole weights back into its shards), and the fit after it trains"""
    r0, r1 = cases('lrfind')
    assert 'error' not in r0 and 'error' not in r1, (r0.get('error'), r1.get('error'))
    for when in ('first', 'after_fit'):
        a, b = r0[when], r1[when]
        assert a['restored'] and b['restored'] and a['trained'] and b['trained']
        assert a['param_type'] == 'DTensor' and len(a['lrs']) >= 5
        assert a['suggestion'] is not None and a['suggestion'] == b['suggestion'] and a['losses'] == b['losses'] and a['lrs'] == b['lrs']
