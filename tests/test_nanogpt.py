"""nanoGPT's recipe on aisaac (issue 46): a model in nanoGPT's interface, trained by the loop of its train.py written out (AdamW in
its two groups, warm-up and cosine with lr_decay_iters and min_lr, gradient accumulation, clipping, an evaluation at iteration 0
and every eval_interval of eval_iters random batches of each split) and by an aisaac Trainer with callbacks: every loss, every
evaluation batch and every weight the same, bit for bit; and the aisaac run resumed from a checkpoint equals the straight one."""
from dataclasses import replace
import pytest, torch
from nanogpt_port import Recipe, prepare, train_py, aisaac_trainer, fit

@pytest.fixture(scope='module')
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp('shakespeare_char_like')
    return d, prepare(d)

def _evals(h, name, k):
    return h.get_metric_values(name, per='batch')[:k]

@pytest.mark.parametrize('recipe', [Recipe(), Recipe(gradient_accumulation_steps=1, dropout=0.0, grad_clip=0.5),
                                    Recipe(gradient_accumulation_steps=3, warmup_iters=0, lr_decay_iters=25)],
                         ids=['accumulation-dropout', 'plain', 'three-micro-steps'])
def test_the_aisaac_run_is_train_pys_bit_for_bit(data, recipe):
    d, vocab = data
    losses, evals, lrs, weights = train_py(recipe, d, vocab)
    t = fit(aisaac_trainer(recipe, d, vocab), recipe)
    got = t.history.get_metric_values('train_loss', per='batch')
    first = next((i for i, (a, b) in enumerate(zip(got, losses)) if a != b), None)
    assert len(got) == len(losses) and first is None, f"micro-step {first}: {got[first]} against train.py's {losses[first]}"
    n = len(evals) * recipe.eval_iters  # train.py evaluates at 0, 10, ..., max_iters; aisaac also after the last step
    assert _evals(t.history, 'valid_loss', n) == [l for e in evals.values() for l in e['val']]
    assert _evals(t.history, 'train/loss', n) == [l for e in evals.values() for l in e['train']]
    assert t.history.get_metric_steps('valid_loss')[:len(evals)] == list(evals)
    assert t.history.get_metric_values('valid_loss')[0] == pytest.approx(sum(evals[0]['val']) / recipe.eval_iters, rel=1e-6)
    for k, v in t.model.state_dict().items(): assert torch.equal(v, weights[k]), k

def test_a_resumed_aisaac_run_is_the_straight_one(data, tmp_path):
    "What nanoGPT's init_from='resume' cannot do (it keeps no random state: the data and the dropout start again from the seed)"
    from aisaac.callbacks.savers import CheckpointCB, checkpoints
    d, vocab = data
    r = Recipe()
    straight = fit(aisaac_trainer(r, d, vocab, CheckpointCB(tmp_path/'a', every='15 steps', every_n_epochs=None, keep_last=None)), r)
    resumed = fit(aisaac_trainer(r, d, vocab), r, resume_from=checkpoints(tmp_path/'a')[0])
    for k, v in straight.model.state_dict().items(): assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert resumed.history.get_metric_values('train_loss', per='batch') == straight.history.get_metric_values('train_loss', per='batch')
    assert resumed.history.get_metric_values('train/loss') == straight.history.get_metric_values('train/loss')

@pytest.mark.cuda
def test_on_a_gpu_with_bfloat16_autocast_the_run_is_train_pys(data):
    "nanoGPT's GPU recipe: bfloat16 autocast (MixedPrecisionCB), fused AdamW"
    d, vocab = data
    r = Recipe(device='cuda', dtype='bfloat16')
    losses, evals, lrs, weights = train_py(r, d, vocab)
    t = fit(aisaac_trainer(r, d, vocab), r)
    assert t.history.get_metric_values('train_loss', per='batch') == losses
    for k, v in t.model.state_dict().items(): assert torch.equal(v.cpu(), weights[k]), k
