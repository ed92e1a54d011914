"Gradient accumulation (GradAccumCB, MicroBatchCB) gives the large batch's gradients; clipping caps the true (unscaled) norm; errors."
import pytest
import torch
from torch import nn
from torcheval.metrics import MulticlassAccuracy

from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.callbacks.gradients import GradAccumCB, MicroBatchCB, GradClipCB

torch.manual_seed(0)
X, Y, C = torch.randn(64, 5), torch.randn(64, 2), torch.randint(0, 3, (64,))

class Grads(Callback):
    "All gradients as one vector at each optimizer step (order 50: after every other before_step)"
    order = 50
    def before_fit(self, t): self.at_step = []
    def before_step(self, t): self.at_step.append(torch.cat([p.grad.flatten() for p in t.model.parameters()]))

def fit(bs, *cbs, n=64, epochs=1, classify=False, model=None, opt=torch.optim.SGD):
    y = C if classify else Y
    torch.manual_seed(1)
    model = model or nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3 if classify else 2))
    grads = Grads()
    loss = nn.CrossEntropyLoss() if classify else nn.MSELoss()
    t = Trainer(DataLoaders(TensorLoader(X[:n], y[:n], bs=bs), TensorLoader(X[:n], y[:n], bs=bs)), loss, opt, model,
                callbacks=[BasicTrainCB(), grads, *cbs])
    t.fit(epochs, lr=0.1, valid=False)
    return grads.at_step, t

def close(a, b, tol=1e-6): return torch.allclose(a, b, atol=tol, rtol=tol)

@pytest.mark.parametrize('bs, n', [(16, 4), (8, 8), (32, 2)])
def test_grad_accum_gives_the_large_batch_gradient(bs, n):
    ref, t_ref = fit(64)
    acc, t = fit(bs, GradAccumCB(n))
    assert len(acc) == 1 and close(acc[0], ref[0])
    assert all(close(p, q) for p, q in zip(t.model.parameters(), t_ref.model.parameters()))

def test_grad_accum_steps_every_n_batches_across_epochs_and_drops_the_leftover():
    steps, t = fit(16, GradAccumCB(3), epochs=2)  # 4 batches per epoch: steps after batches 3 and 6 of 8; 2 left over
    assert len(steps) == 2
    assert all(p.grad is None or not p.grad.any() for p in t.model.parameters())
    assert close(steps[0], fit(48, n=48)[0][0])  # the first step: the first 48 rows

def test_grad_accum_keeps_the_reported_loss():
    losses = []
    class Loss(Callback):
        def after_batch(self, t): losses.append(t.loss.item())
    fit(16, GradAccumCB(4), Loss())
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))  # the weights do not move before the 4th batch
    assert losses == pytest.approx([nn.MSELoss()(model(X[i:i+16]), Y[i:i+16]).item() for i in range(0, 64, 16)], rel=1e-6)

@pytest.mark.parametrize('bs, n_micro, sizes', [(64, 4, [16] * 4), (10, 4, [3, 3, 2, 2]), (3, 5, [1, 1, 1])])
def test_micro_batches_give_the_whole_batch_gradient(bs, n_micro, sizes):
    seen = []
    class Sizes(Callback):
        def predict(self, t): seen.append(len(t.batch[0]))
    ref, t_ref = fit(bs, n=bs)
    mic, t = fit(bs, MicroBatchCB(n_micro), Sizes(), n=bs)
    assert seen == sizes and len(mic) == 1 and close(mic[0], ref[0])
    assert all(close(p, q) for p, q in zip(t.model.parameters(), t_ref.model.parameters()))

def test_micro_batches_leave_the_whole_batch_preds_and_mean_loss_for_metrics():
    rec = []
    class Rec(Callback):
        order = 1
        def after_batch(self, t): rec.append((len(t.batch[0]), t.preds.shape, t.loss.item()))
    _, t = fit(10, MicroBatchCB(3), Rec(), n=10, classify=True)
    n, shape, loss = rec[0]
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    assert (n, shape) == (10, (10, 3)) and loss == pytest.approx(nn.CrossEntropyLoss()(model(X[:10]), C[:10]).item(), rel=1e-6)

def test_micro_batches_in_validation_give_the_same_metrics():
    def metrics(*cbs):
        torch.manual_seed(1)
        t = Trainer(DataLoaders(TensorLoader(X, C, bs=16), TensorLoader(X, C, bs=20)), nn.CrossEntropyLoss(), torch.optim.SGD,
                    nn.Linear(5, 3), callbacks=[BasicTrainCB(), MetricsCB(Accuracy=MulticlassAccuracy()), *cbs])
        t.fit(1, lr=0.1)
        return t.MetricsCB.losses_epoch[-1], t.MetricsCB.metrics_epoch[-1]
    (l1, m1), (l2, m2) = metrics(), metrics(MicroBatchCB(3))
    assert l1['valid'] == pytest.approx(l2['valid'], rel=1e-5) and m1 == m2

def test_micro_batches_and_accumulation_compose():
    ref, _ = fit(64)
    both, _ = fit(32, MicroBatchCB(4), GradAccumCB(2))
    assert len(both) == 1 and close(both[0], ref[0])

def test_micro_batches_run_autocast_per_microbatch():
    on = []
    class Probe(Callback):
        def predict(self, t): on.append(torch.is_autocast_enabled('cpu'))
        def backward(self, t): on.append(torch.is_autocast_enabled('cpu'))
    fit(16, MicroBatchCB(2), MixedPrecisionCB(), Probe())
    assert on[:4] == [True, False, True, False] and not torch.is_autocast_enabled('cpu')

def test_clip_caps_the_total_norm_and_keeps_the_norm_before():
    ref, _ = fit(64)
    clipped, t = fit(64, GradClipCB(0.05))
    assert ref[0].norm() > 0.05
    assert clipped[0].norm().item() == pytest.approx(0.05, rel=1e-5)
    assert close(clipped[0], ref[0] * 0.05 / ref[0].norm(), 1e-5)
    assert t.GradClipCB.norm.item() == pytest.approx(ref[0].norm().item(), rel=1e-6)
    same, _ = fit(64, GradClipCB(100.))
    assert torch.equal(same[0], ref[0])

def test_clip_inf_norm():
    ref, _ = fit(64)
    clipped, _ = fit(64, GradClipCB(0.01, norm_type=float('inf')))
    assert clipped[0].abs().max().item() == pytest.approx(0.01, rel=1e-5)

def test_clip_after_accumulation_clips_the_accumulated_gradient_once():
    ref, _ = fit(64, GradClipCB(0.05))
    acc, _ = fit(16, GradAccumCB(4), GradClipCB(0.05))
    assert close(acc[0], ref[0])

def test_clip_sees_unscaled_float16_gradients():
    mp = MixedPrecisionCB(torch.float16)
    mp.load_state_dict({'scaler': {'scale': 1024., 'growth_factor': 2., 'backoff_factor': 0.5, 'growth_interval': 2000, '_growth_tracker': 0}})
    clipped, t = fit(64, mp, GradClipCB(0.05))
    assert mp.skipped == 0
    assert clipped[0].norm().item() == pytest.approx(0.05, rel=1e-3)
    ref, _ = fit(64)
    assert t.GradClipCB.norm.item() == pytest.approx(ref[0].norm().item(), rel=1e-2)  # float16 forward: close, not equal

@pytest.mark.parametrize('make, msg', [(lambda: GradAccumCB(0), 'n_batches must be a positive integer'),
                                       (lambda: GradAccumCB(2.0), 'n_batches must be a positive integer'),
                                       (lambda: GradAccumCB(True), 'n_batches must be a positive integer'),
                                       (lambda: MicroBatchCB(-1), 'n_micro must be a positive integer'),
                                       (lambda: GradClipCB(-1.0), 'max_norm must be a positive number'),
                                       (lambda: GradClipCB(0), 'max_norm must be a positive number'),
                                       (lambda: GradClipCB('1'), 'max_norm must be a positive number')])
def test_bad_arguments(make, msg):
    with pytest.raises(ValueError, match=msg): make()

# ---------------------------------------------------------------- trainer.sync_gradients: whether a step follows the backward
def test_sync_gradients_says_whether_a_step_follows_the_backward():
    "Read at each training backward; True exactly on the batches whose step is applied; absent without GradAccumCB and after the fit"
    seen = []
    class Rec(Callback):
        order = 100
        def backward(self, t): seen.append([getattr(t, 'sync_gradients', 'absent'), False])
        def after_step(self, t): seen[-1][1] = True
    _, t = fit(16, GradAccumCB(3), Rec(), epochs=2)  # 8 batches: steps after batches 3 and 6
    assert [s for s, _ in seen] == [False, False, True] * 2 + [False, False]
    assert all(s == stepped for s, stepped in seen) and not hasattr(t, 'sync_gradients')
    seen.clear()
    fit(16, Rec())
    assert seen == [['absent', True]] * 4

# ---------------------------------------------------------------- a checkpoint inside an accumulation window resumes exactly
from aisaac.models import GPT, lm_loss
from aisaac.callbacks.savers import CheckpointCB, checkpoints
from checkpoint_run import make_trainer, result

def _lm_batches(lengths, vocab=50, shift=False, seed=0):
    """Micro-batches of right-padded rows of the given lengths: `input_ids` (0 on the padding) and `labels` (-100 there);
    `shift`: the labels are the inputs (Hugging Face's convention), else the next tokens"""
    g, res = torch.Generator().manual_seed(seed), []
    for rows in lengths:
        T = max(rows)
        ids, labels = torch.zeros(len(rows), T, dtype=torch.long), torch.full((len(rows), T), -100)
        for i, n in enumerate(rows):
            ids[i, :n] = torch.randint(1, vocab, (n,), generator=g)
            labels[i, :n] = ids[i, :n] if shift else torch.randint(0, vocab, (n,), generator=g)
        res.append({'input_ids': ids, 'labels': labels})
    return res

def _one_batch(batches):
    "The micro-batches as one batch, padded to the longest row"
    T = max(b['input_ids'].shape[1] for b in batches)
    pad = lambda x, v: nn.functional.pad(x, (0, T - x.shape[1]), value=v)
    return {'input_ids': torch.cat([pad(b['input_ids'], 0) for b in batches]), 'labels': torch.cat([pad(b['labels'], -100) for b in batches])}

class TokenLM(nn.Module):
    "Each position's scores from its own token only: padding cannot change the real positions"
    def __init__(self, vocab=50): super().__init__(); self.emb, self.out = nn.Embedding(vocab, 16), nn.Linear(16, vocab)
    def forward(self, x): return self.out(torch.tanh(self.emb(x)))

LENGTHS = [[8, 3], [5, 5], [2, 7], [6, 1]]  # 11, 10, 9 and 7 real tokens

@pytest.mark.parametrize('kind', ['classes', 'tokens'])
def test_a_checkpoint_inside_a_window_resumes_bit_identical(tmp_path, kind):
    "GradAccumCB(4), 13 batches an epoch, checkpoints after batch 6 (2 into a window) and at the end of epoch 0 (1 into one)"
    every = lambda d: CheckpointCB(d, every_n_batches=6, keep_last=None)
    if kind == 'classes':
        make = lambda d: make_trainer(callbacks=[GradAccumCB(4), every(d)])  # dropout, AdamW, one-cycle, metrics
    else:
        batches = _lm_batches([[3 + (i * 5) % 7, 2 + (i * 3) % 6] for i in range(13)])
        def make(d):
            torch.manual_seed(0)
            dls = DataLoaders(batches, batches[:3])
            return Trainer(dls, lm_loss, torch.optim.AdamW, TokenLM(), callbacks=[BasicTrainCB(), MetricsCB(), GradAccumCB(4), every(d)])
    straight = make(tmp_path/'a')
    straight.fit(3)
    files = checkpoints(tmp_path/'a')
    for name, at in (('checkpoint_0000_000006.pt', 2), ('checkpoint_0001_000000.pt', 1)):
        ckpt = tmp_path/'a'/name
        assert ckpt in files
        state = torch.load(ckpt, weights_only=True)['callbacks']['GradAccumCB']
        assert state['position'] == at and state['grads'] and (state['tokens'] is not None) == (kind == 'tokens')
        resumed = make(tmp_path/name)
        resumed.fit(3, resume_from=ckpt)
        a, b = straight.model.state_dict(), resumed.model.state_dict()
        for k in a: assert torch.equal(a[k], b[k]), (name, k)
        assert resumed.clock.step == straight.clock.step == 39 // 4
        if kind == 'classes': assert result(resumed)['history'] == result(straight)['history']

def test_a_resumed_run_of_steps_inside_a_window_is_bit_identical(tmp_path):
    "fit(steps=9) at 4 batches a step over 13-batch epochs; a checkpoint every 10 batches (clock) falls inside windows"
    make = lambda d: make_trainer(callbacks=[GradAccumCB(4), CheckpointCB(d, every_n_epochs=None, every='10 batches', keep_last=None)])
    straight = make(tmp_path/'a')
    straight.fit(steps=9, valid_every=4)
    for ckpt in checkpoints(tmp_path/'a')[:3]:  # after batches 10, 20 and 30: 2, 0 and 2 into a window
        resumed = make(tmp_path/ckpt.name)
        resumed.fit(steps=9, valid_every=4, resume_from=ckpt)
        a, b = straight.model.state_dict(), resumed.model.state_dict()
        for k in a: assert torch.equal(a[k], b[k]), (ckpt.name, k)
        assert resumed.clock.micro_step == straight.clock.micro_step == 36

class Saves(Callback):
    "Counts the checkpoints written"
    def __init__(self): self.n = 0
    def after_save_checkpoint(self, t): self.n += 1

def test_checkpoints_inside_windows_of_a_run_of_steps_do_not_overwrite_each_other(tmp_path):
    "fit(steps=3) at 4 batches a step, a checkpoint after every batch: 12 batches, 12 points to resume from, 12 files (issue 37)"
    saves = Saves()
    make = lambda d, *cbs: make_trainer(callbacks=[GradAccumCB(4), CheckpointCB(d, every_n_batches=1, keep_last=None), *cbs])
    straight = make(tmp_path/'a', saves)
    straight.fit(steps=3)
    names = [p.name for p in checkpoints(tmp_path/'a')]
    assert saves.n == 13 and len(names) == 12, names  # the 13th, at the end of the pass, is step 3's after validation: it replaces the one before
    inside = [f'checkpoint_step_{s:06d}_batch_{b:06d}.pt' for s in range(3) for b in range(4 * s + 1, 4 * s + 4)]
    assert sorted(names) == sorted(inside + [f'checkpoint_step_{s:06d}.pt' for s in (1, 2, 3)])
    for name in ('checkpoint_step_000001_batch_000006.pt', 'checkpoint_step_000002.pt'):
        state = torch.load(tmp_path/'a'/name, weights_only=True)
        assert state['callbacks']['GradAccumCB']['position'] == (2 if 'batch' in name else 0)
        resumed = make(tmp_path/name)
        resumed.fit(steps=3, resume_from=tmp_path/'a'/name)
        a, b = straight.model.state_dict(), resumed.model.state_dict()
        for k in a: assert torch.equal(a[k], b[k]), (name, k)
        assert resumed.clock.micro_step == 12 and result(resumed)['history'] == result(straight)['history']

# ---------------------------------------------------------------- token-weighted accumulation: the step of one batch of all the tokens
def _grads_and_weights(model, loss_func, batches, *cbs, lr=0.5):
    "The gradients at the one step of a fit on `batches` (SGD), and the weights after it"
    grads = Grads()
    t = Trainer(DataLoaders(batches, batches[:1]), loss_func, torch.optim.SGD, model, callbacks=[BasicTrainCB(), grads, *cbs])
    t.fit(1, lr=lr, valid=False)
    assert len(grads.at_step) == 1
    return grads.at_step[0], torch.cat([p.detach().flatten() for p in model.parameters()])

def _tiny_gpt(): torch.manual_seed(0); return GPT(vocab_size=50, block_size=16, n_layer=1, n_head=2, d_model=16, dropout=0.)

def _tiny_hf():
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0., embd_pdrop=0., attn_pdrop=0.)
    return transformers.GPT2LMHeadModel(cfg)

@pytest.mark.parametrize('path', ['lm_loss', 'GPT', 'huggingface'])
def test_token_weighted_accumulation_equals_one_big_batch(path):
    "4 padded micro-batches of 11, 10, 9 and 7 tokens (shifted: 9, 8, 7, 5), accumulated, give the big batch's gradients and step"
    batches = _lm_batches(LENGTHS, shift=path == 'huggingface')
    make = {'lm_loss': lambda: (torch.manual_seed(0), TokenLM())[1], 'GPT': _tiny_gpt, 'huggingface': _tiny_hf}[path]
    loss_func = lm_loss if path == 'lm_loss' else None
    big_g, big_w = _grads_and_weights(make(), loss_func, [_one_batch(batches)])
    acc_g, acc_w = _grads_and_weights(make(), loss_func, batches, GradAccumCB(4))
    assert torch.allclose(acc_g, big_g, atol=1e-6, rtol=1e-4) and torch.allclose(acc_w, big_w, atol=1e-6, rtol=1e-5)
    equal_g, _ = _grads_and_weights(make(), loss_func, batches, GradAccumCB(4))
    assert torch.equal(equal_g, acc_g)  # deterministic

@pytest.mark.parametrize('how', ['micro', 'micro and accumulation'])
def test_token_weighted_micro_batches_equal_one_big_batch(how):
    "MicroBatchCB cuts a batch of 37 tokens in 4 (11, 10, 9, 7), alone or under GradAccumCB(2) on 2 batches: each token counts once"
    batches = _lm_batches(LENGTHS)
    mk = lambda: (torch.manual_seed(0), TokenLM())[1]
    big_g, big_w = _grads_and_weights(mk(), lm_loss, [_one_batch(batches)])
    if how == 'micro': g, w = _grads_and_weights(mk(), lm_loss, [_one_batch(batches)], MicroBatchCB(4))
    else: g, w = _grads_and_weights(mk(), lm_loss, [_one_batch(batches[:2]), _one_batch(batches[2:])], MicroBatchCB(2), GradAccumCB(2))
    assert torch.allclose(g, big_g, atol=1e-6, rtol=1e-4) and torch.allclose(w, big_w, atol=1e-6, rtol=1e-5)
    losses = []
    class Loss(Callback):
        def after_batch(self, t): losses.append(t.loss.item())
    _grads_and_weights(mk(), lm_loss, [_one_batch(batches)], MicroBatchCB(4), Loss())
    model = mk()
    assert losses == pytest.approx([lm_loss(model(_one_batch(batches)['input_ids']), _one_batch(batches)['labels']).item()], rel=1e-6)

def test_token_weighted_accumulation_across_processes_equals_one_big_batch(tmp_path):
    "2 processes (torchrun, gloo, DDP), 2 micro-batches each of 11 and 10, and 9 and 7 tokens: the step of one batch of all 37 tokens"
    import subprocess, sys
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', __file__, str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    _, big_w = _grads_and_weights((torch.manual_seed(0), TokenLM())[1], lm_loss, [_one_batch(_lm_batches(LENGTHS))])
    for r in range(2): assert torch.allclose(torch.load(tmp_path/f'weights_{r}.pt'), big_w, atol=1e-6, rtol=1e-5)

if __name__ == '__main__':  # one process of the test above, under torchrun
    import sys
    from pathlib import Path
    from torch import distributed as dist
    dist.init_process_group('gloo')
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(TokenLM())
    _grads_and_weights(model, lm_loss, _lm_batches(LENGTHS)[2 * rank:2 * rank + 2], GradAccumCB(2))
    torch.save(torch.cat([p.detach().flatten() for p in model.module.parameters()]), Path(sys.argv[1])/f'weights_{rank}.pt')
    dist.destroy_process_group()

# ---------------------------------------------------------------- clipping sums the norm in the model's order, as a hand-written loop
class _Tiny(nn.Module):
    "nanoGPT's kinds of parameters, interleaved in the model's order: an embedding, linears with biases, a layer norm"
    def __init__(self):
        super().__init__()
        self.emb, self.fc, self.ln, self.out = nn.Embedding(11, 24), nn.Linear(24, 48), nn.LayerNorm(48), nn.Linear(48, 11)
    def forward(self, x): return self.out(self.ln(torch.relu(self.fc(self.emb(x))))).flatten(0, 1)

def _nanogpt_adamw(params, lr):
    "nanoGPT's `configure_optimizers`: the 2-D parameters (decayed) in one group, then the others, each in the model's order"
    ps = [p for p in params if p.requires_grad]
    return torch.optim.AdamW([{'params': [p for p in ps if p.dim() >= 2], 'weight_decay': 0.1},
                              {'params': [p for p in ps if p.dim() < 2], 'weight_decay': 0.0}], lr=lr, betas=(0.9, 0.95))

def test_clip_is_bit_identical_to_a_hand_written_loop_with_nanogpts_groups():
    "The optimizer's groups are in another order than the model's parameters: the clipped norm, and so every weight, is still the hand loop's exactly"
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randint(0, 11, (40, 8, 6), generator=g), torch.randint(0, 11, (40, 8 * 6), generator=g)
    torch.manual_seed(0); ref = _Tiny()
    torch.manual_seed(0); model = _Tiny()
    opt, losses = _nanogpt_adamw(ref.parameters(), 3e-2), []
    for x, y in zip(xs, ys):  # nanoGPT's train.py: forward, backward, clip the model's parameters, step, zero the gradients
        loss = nn.functional.cross_entropy(ref(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step(); opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    class Losses(Callback):
        def before_fit(self, t): self.got = []
        def after_loss(self, t): self.got.append(t.loss.item())
    t = Trainer(DataLoaders(list(zip(xs, ys)), list(zip(xs[:2], ys[:2]))), nn.functional.cross_entropy, _nanogpt_adamw, model,
                callbacks=[BasicTrainCB(), GradClipCB(0.5), rec := Losses()])
    t.fit(1, lr=3e-2, valid=False)
    first = next((i for i, (a, b) in enumerate(zip(rec.got, losses)) if a != b), None)
    assert first is None, f"the losses part at step {first}: {rec.got[first]} against {losses[first]} (diff {abs(rec.got[first] - losses[first]):.2g})"
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))

def test_a_window_resumed_with_momentum_train_cb_keeps_its_gradients_once():
    "Found by the invariance harness (MomentumTrainCB + GradAccumCB under resume, stopped after batch 2 of epoch 1, inside a window): both put the checkpoint's gradients back, MomentumTrainCB setting them and GradAccumCB adding its copy, so the resumed window's gradients were doubled (weights up to 0.0122 from the uninterrupted fit)"
    from aisaac.callbacks.train import MomentumTrainCB
    from aisaac.invariants import Case, check_resume
    case = Case(callbacks=lambda folder: [MetricsCB(acc=MulticlassAccuracy(num_classes=3), show=False), MomentumTrainCB(), GradAccumCB(2)])
    assert check_resume(case, points=[('epochs', 1, 2)]) == []
