"""AccelerateCB on 2 CPU processes (torchrun, gloo) on a Fashion-MNIST sample: the same weights and buffers on both, the
validation metric of a single process's evaluation, and one process only writing checkpoints and logs."""
import os, subprocess, sys
from pathlib import Path
import pytest
import torch
from torch import nn

pytest.importorskip('accelerate')
from accel_run import data, make_model

HERE = Path(__file__).parent

def cpu_env(n_procs=2):
    "The processes' environment: these are CPU tests (gloo); with fewer GPUs than processes, the GPU is hidden from them "
    "(on one GPU, Accelerate would take NCCL, and NCCL refuses two processes on one device)"
    return {**os.environ, 'CUDA_VISIBLE_DEVICES': ''} if torch.cuda.device_count() < n_procs else None

def launch(out, n_procs, n_train=1024, n_valid=200, epochs=2):
    "Run tests/accel_run.py on `n_procs` CPU processes; returns each process's result"
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', str(n_procs),
           str(HERE/'accel_run.py'), str(out), str(n_train), str(n_valid), str(epochs)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=cpu_env(n_procs))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return [torch.load(out/f'result_{r}.pt', weights_only=True) for r in range(n_procs)]

@pytest.fixture(scope='module')
def two(tmp_path_factory):
    out = tmp_path_factory.mktemp('accel2')
    return out, launch(out, 2)

def test_both_processes_end_with_the_same_weights_and_buffers(two):
    out, (r0, r1) = two
    assert r0['processes'] == r1['processes'] == 2
    assert list(r0['state']) == list(r1['state'])
    for k in r0['state']: assert torch.equal(r0['state'][k], r1['state'][k]), k
    assert any('running_mean' in k for k in r0['state'])  # batch norm buffers are compared too

def test_the_validation_metrics_equal_a_single_process_evaluation(two):
    "200 validation images in batches of 32 on 2 processes: the last batches are padded, and no padding is counted"
    out, (r0, r1) = two
    model = make_model()
    model.load_state_dict(r0['state'])
    model.eval()
    valid = data(1024, 200).valid.dataset.tensors
    assert len(valid[0]) == 200
    with torch.no_grad(): preds = model(valid[0])
    acc, loss = (preds.argmax(1) == valid[1]).float().mean().item(), nn.CrossEntropyLoss()(preds, valid[1]).item()
    for r in (r0, r1):  # every process computed the metrics on the gathered predictions
        h = r['history']['epoch']
        assert h['acc']['values'][-1] == acc
        assert h['valid_loss']['values'][-1] == pytest.approx(loss, rel=1e-5)

def test_only_the_main_process_writes_checkpoints_and_logs(two):
    out, _ = two
    assert (out/'writes_0.txt').read_text().split() == [str(out/'ckpt'/'checkpoint_0001_000000.pt'),
                                                      str(out/'ckpt'/'checkpoint_0002_000000.pt'), str(out/'final.pt')]
    assert not (out/'writes_1.txt').exists()
    rows = (out/'log.txt').read_text().splitlines()
    assert len(rows) == 2 and all(r.startswith('0 ') for r in rows)
    printed = (out/'stdout_0.txt').read_text().splitlines()
    assert printed[0].split() == ['epoch', 'train', 'valid', 'acc'] and len(printed) == 3
    assert (out/'stdout_1.txt').read_text() == ''
    assert not list(out.rglob('.*.tmp'))

def test_loggers_make_no_file_on_the_other_processes(two):
    "Loggers run on the main process only: switched off on rank 1 before any `before_fit`, so rank 1 never makes its file"
    out, _ = two
    assert (out/'epochs_0.csv').exists() and (out/'log_0.jsonl').exists()
    assert not (out/'epochs_1.csv').exists() and not (out/'log_1.jsonl').exists()

def test_a_language_model_on_dict_batches_validates_every_token_once(tmp_path):
    "Dict batches (input_ids, labels) on 2 processes: the gathered validation loss and perplexity are a single process's, over all 50 blocks"
    import math
    import accel_lm_run as lm
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', str(HERE/'accel_lm_run.py'), str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=cpu_env())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    r0, r1 = (torch.load(tmp_path/f'result_{r}.pt', weights_only=True) for r in range(2))
    for k in r0['state']: assert torch.equal(r0['state'][k], r1['state'][k]), k
    model = lm.make_model()
    model.load_state_dict(r0['state'])
    ids = lm.Blocks(50, 1).ids
    with torch.no_grad(): loss = lm.lm_loss(model(ids[:, :-1]), ids[:, 1:]).item()
    for r in (r0, r1):
        h = r['history']['epoch']
        assert h['valid_loss']['values'][-1] == pytest.approx(loss, rel=1e-5)
        assert h['perplexity']['values'][-1] == pytest.approx(math.exp(loss), rel=1e-4)

def test_accumulation_is_gradaccumcbs_and_acceleratecb_refuses_its_own():
    "`AccelerateCB(gradient_accumulation_steps=2)` stepped after every batch with halved losses (it never entered `accelerate`'s accumulation): refused, naming `GradAccumCB`, which gives the weights of one batch twice the size"
    import copy
    from types import SimpleNamespace
    from torch.utils.data import DataLoader, TensorDataset
    from aisaac.trainer import Trainer
    from aisaac.callbacks.accel import AccelerateCB
    from aisaac.callbacks.gradients import GradAccumCB
    with pytest.raises(ValueError, match=r'accumulate with aisaac.s callback instead, `callbacks=\[AccelerateCB\(\), GradAccumCB\(2\)\]`'):
        AccelerateCB(gradient_accumulation_steps=2)
    torch.manual_seed(0)
    x, y = torch.randn(40, 3), torch.randn(40, 1)
    m0 = torch.nn.Linear(3, 1)
    dl = DataLoader(TensorDataset(x, y), 10)
    t = Trainer(SimpleNamespace(train=dl, valid=dl), torch.nn.MSELoss(), torch.optim.SGD, copy.deepcopy(m0), callbacks=[AccelerateCB(), GradAccumCB(2)])
    t.fit(1, lr=0.1, valid=False)
    h = copy.deepcopy(m0); opt = torch.optim.SGD(h.parameters(), lr=0.1)
    for i in (0, 20): torch.nn.functional.mse_loss(h(x[i:i + 20]), y[i:i + 20]).backward(); opt.step(); opt.zero_grad()
    torch.testing.assert_close(t.model.weight, h.weight)
