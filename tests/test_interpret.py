"Interpretation: a classifier's confusion matrix, most confused classes and top losses, from the trainer's predictions; only the inputs of the largest losses kept."
import matplotlib
matplotlib.use('Agg')
import pytest, torch
import torch.nn.functional as F
from torch import nn
from aisaac.data import TensorLoader
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.interpret import Interpretation, ItemLossesCB, item_losses

def make(n=60):
    "A classifier of 1×4×6 'images' into 3 classes, trained a little; its validation loader (batches of 16) and data"
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 1, 4, 6, generator=g), torch.randint(0, 3, (n,), generator=g)
    dls = type('DLs', (), {'train': TensorLoader(x, y, bs=16, shuffle=True, seed=0), 'valid': TensorLoader(x, y, bs=16)})()
    torch.manual_seed(0)
    t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, nn.Sequential(nn.Flatten(), nn.Linear(24, 3)), callbacks=[BasicTrainCB()])
    t.fit(1, lr=0.1)
    return t, x, y

def test_the_confusion_matrix_equals_a_bincount():
    t, x, y = make()
    interp = Interpretation.from_trainer(t)
    with torch.no_grad(): pred = t.model(x).argmax(1)
    cm = torch.bincount(y * 3 + pred, minlength=9).reshape(3, 3)  # rows: actual, columns: predicted
    assert torch.equal(interp.confusion_matrix(), cm) and cm.sum() == 60
    want = sorted(((str(a), str(p), int(cm[a, p])) for a in range(3) for p in range(3) if a != p and cm[a, p] >= 2), key=lambda r: -r[2])
    got = interp.most_confused(min_val=2)
    assert [r[2] for r in got] == [r[2] for r in want] and set(got) == set(want) and got
    named = Interpretation.from_trainer(t, classes=['ant', 'bee', 'cat']).most_confused(min_val=2)
    assert [(r[0], r[1]) for r in named] == [('ant bee cat'.split()[int(a)], 'ant bee cat'.split()[int(p)]) for a, p, _ in got]

def test_the_top_losses_are_the_largest_in_order():
    t, x, y = make()
    interp = Interpretation.from_trainer(t, keep=5)
    with torch.no_grad(): losses = F.cross_entropy(t.model(x), y, reduction='none')
    want = losses.sort(descending=True)
    vals, idxs = interp.top_losses(5)
    torch.testing.assert_close(vals, want.values[:5])
    assert torch.equal(idxs, want.indices[:5])
    assert torch.equal(interp.top_idxs, idxs) and torch.equal(interp.top_inputs, x[idxs])  # the inputs kept: these 5 only
    torch.testing.assert_close(interp.losses, losses)
    low, _ = interp.top_losses(3, largest=False)
    torch.testing.assert_close(low, want.values[-3:].flip(0))

def test_only_the_inputs_of_the_largest_losses_are_kept():
    t, x, y = make()
    interp = Interpretation.from_trainer(t, keep=4)
    assert interp.top_inputs.shape == (4, 1, 4, 6)
    fig = interp.plot_top_losses(4)
    assert len([ax for ax in fig.axes if ax.images]) == 4
    with pytest.raises(ValueError, match=r'keep=9'): interp.plot_top_losses(9)

def test_any_loss_function_and_another_loader():
    "A loss without `reduction` is computed item by item; `dl=` interprets another loader"
    t, x, y = make()
    t.loss_func = lambda p, y: F.cross_entropy(p, y)
    x2, y2 = x[:20] * 2, y[:20]
    interp = Interpretation.from_trainer(t, dl=TensorLoader(x2, y2, bs=8), keep=3)
    with torch.no_grad(): torch.testing.assert_close(interp.losses, F.cross_entropy(t.model(x2), y2, reduction='none'))
    assert interp.confusion_matrix().sum() == 20
    torch.testing.assert_close(item_losses(nn.CrossEntropyLoss(), torch.eye(3), torch.arange(3)), item_losses(F.cross_entropy, torch.eye(3), torch.arange(3)))

def test_a_table_when_the_inputs_are_not_images():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(40, 5, generator=g), torch.randint(0, 2, (40,), generator=g)
    dls = type('DLs', (), {'train': TensorLoader(x, y, bs=8), 'valid': TensorLoader(x, y, bs=8)})()
    t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, nn.Linear(5, 2), callbacks=[BasicTrainCB()])
    interp = Interpretation.from_trainer(t)
    table = interp.plot_top_losses(3)
    assert len(table) == 3 and [r[0] for r in table] == interp.top_losses(3)[1].tolist()
    assert 'probability' in repr(table)

def test_a_regression_has_no_confusion_matrix():
    x = torch.randn(16, 2)
    dls = type('DLs', (), {'train': TensorLoader(x, x.sum(1, keepdim=True), bs=8), 'valid': TensorLoader(x, x.sum(1, keepdim=True), bs=8)})()
    t = Trainer(dls, nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[BasicTrainCB()])
    interp = Interpretation.from_trainer(t)
    assert interp.top_losses(2)[0].shape == (2,) and len(interp.plot_top_losses(2)) == 2  # a table: the inputs are not images
    with pytest.raises(ValueError, match='class indices'): interp.confusion_matrix()

def test_an_evaluation_set_is_not_mixed_into_the_validation_sets_items():
    "A validation set of 60 and an evaluation set of 40 (`EvalSetsCB`): 60 item losses and predictions, and the top losses are items of the validation set (before: 100 item losses, top losses naming items 60 to 99, which do not exist)"
    from aisaac.evals import EvalSetsCB
    t, x, y = make()
    g = torch.Generator().manual_seed(1)
    far = TensorLoader(torch.randn(40, 1, 4, 6, generator=g) * 10, torch.randint(0, 3, (40,), generator=g), bs=16)  # far from the training data: large losses
    from aisaac.callbacks.metrics import MetricsCB
    t.add_callbacks([MetricsCB(show=False), EvalSetsCB(far=far)])
    interp = Interpretation.from_trainer(t, keep=5)
    with torch.no_grad(): losses = F.cross_entropy(t.model(x), y, reduction='none')
    assert len(interp.preds) == len(interp.losses) == 60
    torch.testing.assert_close(interp.losses, losses)
    assert interp.top_losses(3)[1].tolist() == losses.topk(3).indices.tolist() == interp.top_idxs[:3].tolist()
    cb = ItemLossesCB(keep=3)  # in a fit of the user's: the validation set's items only
    t.fit(1, lr=0.1, train=False, callbacks=cb)
    assert len(cb.losses) == 60 and cb.top_idxs.max() < 60

def test_a_resumed_fit_keeps_every_items_loss_as_the_straight_fit_does():
    """Found by the invariance harness (issue 51): the item losses kept before a checkpoint were in no state, so the fit resumed from it had
    only those after (n 64 against the straight fit's 128 at the end of epoch 0, its top_idxs 119 off)"""
    from aisaac.coverage import check
    assert check(['ItemLossesCB'], 'resume') == []

def test_a_language_models_top_losses_are_a_table_and_a_nan_loss_ranks_last():
    """Found by a user's trial: on a GPT's dict batches `plot_top_losses` raised `KeyError: 0` (the kept inputs are a dict, read as an image
    batch), and an item whose labels are all -100 (loss NaN) ranked first in `top_losses`: now a table, and NaN last"""
    from aisaac.data import DataLoaders
    from aisaac.models import lm_loss
    from aisaac.setups import tiny_gpt
    from aisaac.trainer import Trainer
    from aisaac.callbacks.train import BasicTrainCB
    from aisaac.callbacks.interpret import Interpretation
    g = torch.Generator().manual_seed(0)
    batch = lambda: {'input_ids': torch.randint(0, 16, (3, 6), generator=g), 'labels': torch.randint(0, 16, (3, 6), generator=g)}
    valid = [batch(), batch()]
    valid[1]['labels'][0] = -100  # item 3: nothing to score
    t = Trainer(DataLoaders(valid, valid), lm_loss, model=tiny_gpt(), callbacks=[BasicTrainCB()])
    it = Interpretation.from_trainer(t)
    assert torch.isnan(it.losses[3]) and 3 not in it.top_losses(5).indices.tolist() and it.top_losses().indices[-1] == 3
    table = it.plot_top_losses(3)
    assert 'item' in repr(table) and len(repr(table).splitlines()) == 4
