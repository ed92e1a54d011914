"Batch transforms and tensor augmentations: where they act, exact values, fractions touched, seeds; `rand_erase`/`rand_copy` in place (as miniai's), the modules on a copy."
import pytest, torch
import torch.nn.functional as F
from functools import partial
from torch import nn

from aisaac.utils import set_seed
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.augment import (tfm_batch, BatchTransformCB, BatchAugmentationCB, hflip, random_hflip, RandomHorizontalFlip,
                                      random_crop, RandomCrop, rand_erase, RandErase, rand_copy, RandCopy, UnNormalize)

class Seen(Callback):
    order = 1
    def __init__(self): self.batches = []
    def before_predict(self, t): self.batches.append((t.training, tuple(o.clone() for o in t.batch)))

def seen(*cbs, x=None):
    x = torch.arange(8.).reshape(2, 1, 2, 2) if x is None else x
    y = torch.tensor([1., 2.])
    dls = type('DLs', (), {'train': [(x, y)], 'valid': [(x, y)]})()
    look = lambda preds, y: preds.mean()  # only the batches are looked at: a loss that takes any targets
    t = Trainer(dls, look, torch.optim.SGD, nn.Sequential(nn.Flatten(), nn.LazyLinear(1), nn.Flatten(0)), callbacks=[BasicTrainCB(), Seen(), *cbs])
    t.fit(1)
    return t.Seen.batches

neg = partial(tfm_batch, tfm_x=torch.neg)

@pytest.mark.parametrize('kw,train,valid', [({}, True, True), ({'on_valid': True}, True, True), ({'on_train': False}, False, True),
                                            ({'on_train': False, 'on_valid': True}, False, True), ({'on_val': True}, True, True),
                                            ({'on_valid': True, 'on_val': False}, True, False)])
def test_batch_transform_cb_where_it_acts(kw, train, valid):
    (t_train, (xt, yt)), (t_valid, (xv, yv)) = seen(BatchTransformCB(neg, **kw))
    x = torch.arange(8.).reshape(2, 1, 2, 2)
    assert (t_train, t_valid) == (True, False)
    assert torch.equal(xt, -x if train else x) and torch.equal(xv, -x if valid else x)
    assert torch.equal(yt, torch.tensor([1., 2.])) and torch.equal(yv, torch.tensor([1., 2.]))

@pytest.mark.parametrize('bad', [None, 3, [torch.neg], 'flip'])
def test_batch_transform_cb_needs_a_callable(bad):
    with pytest.raises(TypeError, match='BatchTransformCB needs a function of the whole batch') as e: BatchTransformCB(bad)
    assert 'BatchAugmentationCB' in str(e.value) and 'tfm_batch' in str(e.value)

def test_tfm_batch_keeps_other_items():
    b = (torch.ones(2), torch.zeros(2), 'extra')
    x, y, extra = tfm_batch(b, tfm_y=lambda y: y + 1)
    assert torch.equal(x, torch.ones(2)) and torch.equal(y, torch.ones(2)) and extra == 'extra'

def test_batch_augmentation_cb():
    x = torch.arange(8.).reshape(2, 1, 2, 2)
    (_, (xt, yt)), (_, (xv, yv)) = seen(BatchAugmentationCB([torch.neg, lambda y: y * 10]))
    assert torch.equal(xt, -x) and torch.equal(yt, torch.tensor([10., 20.]))
    assert torch.equal(xv, -x) and torch.equal(yv, torch.tensor([10., 20.]))  # AIsaac's: validation batches too
    (_, (xt, yt)), (_, (xv, yv)) = seen(BatchAugmentationCB([None, torch.neg], on_valid=False))
    assert torch.equal(xt, x) and torch.equal(yt, torch.tensor([-1., -2.])) and torch.equal(yv, torch.tensor([1., 2.]))
    (_, (xt, _)), _ = seen(BatchAugmentationCB(torch.neg))
    assert torch.equal(xt, -x)
    with pytest.raises(TypeError, match='needs callables'): BatchAugmentationCB([torch.neg, 'y'])
    with pytest.raises(ValueError, match='3 transforms for a batch of 2 items'): seen(BatchAugmentationCB([None, None, torch.neg]))

def test_batch_transform_cb_on_real_pipeline_keeps_loader_data():
    "The augmentations never write into the batch: a `TensorLoader`'s batches are views of its dataset"
    from aisaac.data import TensorLoader
    xs, ys = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    before = xs.clone()
    dls = type('DLs', (), {'train': TensorLoader(xs, ys, bs=8), 'valid': TensorLoader(xs, ys, bs=8)})()
    aug = nn.Sequential(RandomCrop(28, padding=4), RandomHorizontalFlip(), RandErase(), RandCopy())
    t = Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, nn.Sequential(nn.Flatten(), nn.Linear(784, 10)),
                callbacks=[BasicTrainCB(), BatchTransformCB(partial(tfm_batch, tfm_x=aug), on_valid=True), Seen()])
    t.fit(1)
    assert torch.equal(xs, before)
    assert not torch.equal(torch.cat([b[0] for tr, b in t.Seen.batches if tr]), xs)

def test_hflip_exact():
    x = torch.arange(2 * 3 * 4 * 5.).reshape(2, 3, 4, 5)
    assert torch.equal(hflip(x)[..., 0], x[..., 4]) and torch.equal(hflip(hflip(x)), x)
    assert torch.equal(random_hflip(x, 1.), hflip(x)) and torch.equal(random_hflip(x, 0.), x)
    assert torch.equal(random_hflip(x[0], 1.), hflip(x[0]))  # one image, C x H x W
    set_seed(0)
    x = torch.randn(4000, 1, 3, 3)
    out = RandomHorizontalFlip(p=0.25)(x)
    flipped = (out == hflip(x)).flatten(1).all(1)
    assert torch.equal(out[~flipped], x[~flipped])
    assert abs(flipped.float().mean().item() - 0.25) < 0.03

def test_random_crop_is_a_shift_of_the_padded_image():
    set_seed(0)
    x = torch.randn(500, 2, 10, 10)
    out = random_crop(x, padding=2)
    assert out.shape == x.shape
    padded = F.pad(x, (2, 2, 2, 2))
    wins = padded.unfold(2, 10, 1).unfold(3, 10, 1)  # N, C, 5, 5, 10, 10: every 10x10 window
    match = (wins == out[:, :, None, None]).flatten(4).all(-1).all(1)  # N, 5, 5
    assert (match.flatten(1).sum(1) == 1).all()  # exactly one offset per image
    counts = match.sum(0)
    assert counts.min() > 0  # every offset of 0..4 x 0..4 happens (20 images each on average)
    assert counts.max() < 40

def test_random_crop_sizes_modes_and_errors():
    set_seed(0)
    x = torch.randn(8, 3, 12, 16)
    assert random_crop(x, (6, 10)).shape == (8, 3, 6, 10)
    assert RandomCrop(5)(x).shape == (8, 3, 5, 5)
    assert torch.equal(random_crop(x), x)  # full size, no padding: nothing to move
    out = random_crop(x, 12, padding=3, mode='reflect')
    assert out.shape == (8, 3, 12, 12)
    assert torch.isin(out, x).all()  # reflection only repeats pixels of the image
    with pytest.raises(ValueError, match='crops of 20x20 do not fit in images of 12x16'): random_crop(x, 20)

def test_rand_erase_fraction_and_values():
    set_seed(0)
    x = torch.randn(3000, 3, 20, 20)
    changed = (rand_erase(x.clone(), 0.25, 1) != x)
    per_img = changed.flatten(1).sum(1)
    assert set(per_img.tolist()) == {0, 3 * 25}  # one 5x5 box, in every channel, or nothing
    assert abs((per_img > 0).float().mean().item() - 0.5) < 0.04
    assert (changed[:, 0] == changed[:, 2]).all()
    frac = (rand_erase(x.clone(), 0.25, 4) != x).float().mean().item()  # on average 2 boxes of 25/400 each, a few overlapping
    assert 0.105 < frac < 0.125, frac
    out = RandErase()(x)
    assert out.min() >= x.min() and out.max() <= x.max()
    assert torch.equal(rand_erase(x, 0.2, 0), x) and torch.equal(rand_erase(x, 0., 4), x)
    with pytest.raises(ValueError, match='between 0 and 1; got 1.5'): rand_erase(x, 1.5)
    with pytest.raises(ValueError, match='between 0 and 1; got -0.1'): RandCopy(-0.1)(x)

def test_rand_copy_only_moves_pixels_within_an_image():
    set_seed(0)
    x = torch.randn(300, 1, 20, 20)
    out = RandCopy(0.25, 4)(x)
    for k in range(300): assert torch.isin(out[k], x[k]).all()
    touched = (out != x).flatten(1).any(1).float().mean().item()
    assert 0.7 < touched < 0.85, touched  # P(0 copies) = 1/5, and a copy rarely lands on itself
    one = rand_copy(x.clone(), 0.25, 1)
    diff = (one != x).flatten(1).sum(1)
    assert diff.max() <= 25

@pytest.mark.parametrize('aug', [RandomHorizontalFlip(), RandomCrop(28, padding=4), RandErase(), RandCopy()])
def test_augmentations_seeded_single_image_and_dtype(aug):
    x = torch.randn(16, 1, 28, 28)
    set_seed(3); a = aug(x)
    set_seed(3); b = aug(x)
    assert torch.equal(a, b)
    assert aug(x[0]).shape == (1, 28, 28)
    assert aug(x.bfloat16()).dtype == torch.bfloat16

def test_augmentations_show_their_settings():
    assert repr(nn.Sequential(RandomCrop(28, padding=4), RandomHorizontalFlip(0.3), RandErase(), RandCopy(0.1, 2))).split('\n')[1:5] == [
        "  (0): RandomCrop(size=28, padding=4, mode='constant')", '  (1): RandomHorizontalFlip(p=0.3)',
        '  (2): RandErase(pct=0.2, max_num=4)', '  (3): RandCopy(pct=0.1, max_num=2)']

def test_unnormalize():
    x = torch.rand(2, 3, 4, 4)
    m, s = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 1., 2.])
    n = (x - m[:, None, None]) / s[:, None, None]
    copy = n.clone()
    torch.testing.assert_close(UnNormalize(m.tolist(), s.tolist())(n[1]), x[1])
    torch.testing.assert_close(n[1], x[1])  # in place, as AIsaac's: the image itself is un-normalised
    assert torch.equal(n[0], copy[0])  # the rest of the batch untouched
    out = UnNormalize(m, s)(n)
    assert out is n and not torch.allclose(n[1], x[1])  # the whole batch, in place (image 1 twice now)
    with pytest.raises(TypeError, match='convert it first'): UnNormalize(0.5, 0.5)(torch.zeros(3, 2, 2, dtype=torch.uint8))
    torch.testing.assert_close(UnNormalize(0.28, 0.35)((x - 0.28) / 0.35), x)

@pytest.mark.parametrize('func,module', [(rand_erase, RandErase), (rand_copy, RandCopy)])
def test_box_functions_work_in_place_and_modules_on_a_copy(func, module):
    "miniai's `rand_erase(x)`/`rand_copy(x)` change `x` and return it; the modules, used by callbacks, never change their input"
    set_seed(0)
    x = torch.randn(64, 1, 28, 28)
    xb = x.clone()
    out = func(xb, 0.25, 4)
    assert out is xb and not torch.equal(xb, x)
    img = x[0].clone()
    assert func(img, 0.25, 4).data_ptr() == img.data_ptr() and not torch.equal(img, x[0])  # one C x H x W image, in place too
    before = x.clone()
    out = module(0.25, 4)(x[:16])  # a slice of a data set, as a list of pre-made batches holds
    assert not torch.equal(out, before[:16]) and torch.equal(x, before)
