"capture_preds and test-time augmentation: shapes, equality with a hand-written evaluation, the averages, and the errors."
import pytest, torch
from torch import nn

from aisaac.core.callback import Callback
from aisaac.data import TensorLoader
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.augment import hflip
from aisaac.callbacks.preds import CapturePredsCB, CapturePreds

def make(shuffle_valid=False, n=50):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 1, 4, 6, generator=g), torch.randint(0, 3, (n,), generator=g)
    dls = type('DLs', (), {'train': TensorLoader(x, y, bs=16, shuffle=True, seed=0),
                           'valid': TensorLoader(x, y, bs=16, shuffle=shuffle_valid, seed=1)})()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(24, 3))
    return Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[BasicTrainCB()]), x, y

def test_capture_preds_equals_a_manual_evaluation():
    t, x, y = make()
    t.fit(1, lr=0.1)
    preds, targs = t.capture_preds()
    assert preds.shape == (50, 3) and preds.dtype == torch.float32 and not preds.requires_grad
    assert torch.equal(targs, y)
    with torch.no_grad(): torch.testing.assert_close(preds, t.model(x))
    p2, t2, xs = t.capture_preds(inps=True)
    assert torch.equal(p2, preds) and torch.equal(xs, x)

def test_tta_averages_plain_and_augmented():
    t, x, _ = make()
    plain, _ = t.capture_preds()
    flip, _ = t.capture_preds(tta=hflip)
    with torch.no_grad(): torch.testing.assert_close(flip, (plain + t.model(hflip(x))) / 2)
    two, _ = t.capture_preds(tta=[hflip, torch.neg])
    with torch.no_grad(): torch.testing.assert_close(two, (plain + t.model(hflip(x)) + t.model(-x)) / 3)
    assert torch.equal(t.capture_preds()[0], plain)  # the augmentation does not stay

def test_tta_needs_the_same_order():
    t, _, _ = make(shuffle_valid=True)
    t.capture_preds()  # fine without TTA
    with pytest.raises(ValueError, match='use a validation loader that does not shuffle'): t.capture_preds(tta=hflip)

def test_extra_callbacks_for_the_passes_only():
    class Count(Callback):
        n = 0
        def after_batch(self, t): self.n += 1
    t, _, _ = make()
    c = Count()
    t.capture_preds(callbacks=c, tta=hflip)
    assert c.n == 2 * 4 and not hasattr(t, 'Count')

def test_capture_preds_cb_in_a_fit():
    t, x, y = make()
    cp = CapturePreds(inps=True)
    assert issubclass(CapturePreds, CapturePredsCB)
    t.fit(1, lr=0., callbacks=cp)  # training batches (shuffled) then validation batches
    assert cp.all_preds.shape == (100, 3) and cp.all_inps.shape == (100, 1, 4, 6)
    assert torch.equal(cp.all_targs[50:], y) and torch.equal(cp.all_targs[:50].sort().values, y.sort().values)
    assert CapturePredsCB().inps is False

def test_the_course_s_capture_preds_keeps_the_inputs():
    "miniai's `CapturePreds` always keeps `all_inps`; aisaac's `CapturePredsCB` only when asked"
    t, x, y = make()
    cp, cb = CapturePreds(), CapturePredsCB()
    t.fit(1, train=False, callbacks=[cp, cb])
    assert torch.equal(cp.all_inps, x) and torch.equal(cp.all_targs, y) and cp.all_preds.shape == (50, 3)
    assert cb.all_inps is None and torch.equal(cb.all_preds, cp.all_preds)
    assert CapturePreds(inps=False).inps is False

def test_capture_preds_on_another_loader():
    "`dl=`: the predictions on that loader (a test set, say); the validation loader is back afterwards, also after an error"
    t, x, y = make()
    valid = t.dls.valid
    x2, y2 = torch.randn(20, 1, 4, 6), torch.randint(0, 3, (20,))
    preds, targs = t.capture_preds(dl=TensorLoader(x2, y2, bs=8))
    with torch.no_grad(): torch.testing.assert_close(preds, t.model(x2))
    assert torch.equal(targs, y2) and t.dls.valid is valid
    with pytest.raises(RuntimeError): t.capture_preds(dl=TensorLoader(torch.randn(4, 5), y2[:4], bs=2))  # the model takes 24 features
    assert t.dls.valid is valid

def test_the_targets_captured_are_the_ones_the_loss_scores_whatever_the_batchs_shape():
    "A batch `(x, y, w)` with a weighted loss (the rest of the batch are the targets): `y` is captured and the item losses weigh by `w` (before: `w` was captured as the target); a dict batch's target by its key (before: a bare `KeyError: -1`)"
    from types import SimpleNamespace
    from aisaac.trainer import Trainer
    from aisaac.callbacks.train import BasicTrainCB
    from aisaac.callbacks.interpret import ItemLossesCB
    torch.manual_seed(0)
    x, y, w = torch.randn(40, 3), torch.randint(0, 4, (40,)), torch.rand(40)
    def wce(p, y, w): return (torch.nn.functional.cross_entropy(p, y, reduction='none') * w).mean()
    b = [(x[i:i + 10], y[i:i + 10], w[i:i + 10]) for i in range(0, 40, 10)]
    t = Trainer(SimpleNamespace(train=b, valid=b), wce, torch.optim.SGD, torch.nn.Linear(3, 4), callbacks=[BasicTrainCB()])
    t.fit(1, lr=0.1)
    preds, targs = t.capture_preds()
    assert torch.equal(targs, y)
    t.fit(1, train=False, callbacks=[items := ItemLossesCB()])
    with torch.no_grad(): by_hand = torch.nn.functional.cross_entropy(t.model(x), y, reduction='none') * w
    torch.testing.assert_close(items.losses, by_hand)
    class M(torch.nn.Module):
        def __init__(self): super().__init__(); self.l = torch.nn.Linear(3, 4)
        def forward(self, x): return self.l(x)
    d = [{'x': x[i:i + 10], 'label': y[i:i + 10]} for i in range(0, 40, 10)]
    t = Trainer(SimpleNamespace(train=d, valid=d), torch.nn.CrossEntropyLoss(), torch.optim.SGD, M(), callbacks=[BasicTrainCB()])
    t.fit(1)
    assert torch.equal(t.capture_preds()[1], y)

@pytest.mark.parametrize('name', ['CapturePredsCB', 'CapturePreds'])
def test_a_resumed_fit_captures_every_batch_as_the_straight_fit_does(name):
    """Found by the invariance harness (issue 51): the predictions kept before a checkpoint were in no state, so the fit resumed from it had
    only those after (all_preds (64, 3) against the straight fit's (128, 3), at the end of epoch 0; (40, 3) at batch 2 of epoch 1)"""
    from aisaac.coverage import check
    assert check([name], 'resume') == []

def test_the_predictions_in_a_checkpoint_are_tensors_on_the_cpu(tmp_path):
    "What a checkpoint keeps of `CapturePreds` mid-fit: the rows so far, plain tensors (read with `weights_only=True`); nothing between fits"
    from aisaac.invariants import tiny_trainer
    class Save(Callback):
        order = 1000
        def checkpoint(self, trainer, at):
            if at == 'epoch' and trainer.epoch == 0: trainer.save_checkpoint(tmp_path/'c.pt')
    t = tiny_trainer([cp := CapturePreds(), Save()])
    t.fit(2, lr=1e-2)
    state = torch.load(tmp_path/'c.pt', weights_only=True)['callbacks']['CapturePreds']
    shares = state.pop('shares')  # (each process's places among the rows: one process, all of them)
    assert len(shares) == 1 and shares[0].tolist() == list(range(64))
    assert {k: tuple(v.shape) for k, v in state.items()} == {'preds': (64, 3), 'targs': (64,), 'inps': (64, 4)}
    assert all(v.device.type == 'cpu' for v in state.values()) and cp.state_dict() == {} and cp.all_preds.shape == (128, 3)

def test_batches_of_sequences_padded_to_their_own_longest_join_padded_with_minus_100():
    """`capture_preds` on a language model whose batches are padded each to its own longest row (an SFT loader): the predictions (B, T, V)
    and labels (B, T) of batches of 5 and 7 positions are joined padded to 7 with -100, as Hugging Face's Trainer pads (before: torch.cat
    raised `Sizes of tensors must match`)"""
    from aisaac.data import DataLoaders
    from aisaac.models import lm_loss
    from aisaac.setups import tiny_gpt
    g = torch.Generator().manual_seed(0)
    batch = lambda T: {'input_ids': torch.randint(0, 16, (2, T), generator=g), 'labels': torch.randint(0, 16, (2, T), generator=g)}
    valid = [batch(5), batch(7)]
    t = Trainer(DataLoaders(valid, valid), lm_loss, model=tiny_gpt(), callbacks=[BasicTrainCB()])
    preds, targs = t.capture_preds()
    assert preds.shape[:2] == (4, 7) and targs.shape == (4, 7)
    assert torch.equal(targs[:2, :5], valid[0]['labels']) and (targs[:2, 5:] == -100).all() and torch.equal(targs[2:], valid[1]['labels'])
    assert (preds[:2, 5:] == -100).all() and not (preds[:2, :5] == -100).any()
