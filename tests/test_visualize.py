"Model summary, peek_batch, image batches and ImageVisualizerCB: numbers, no side effects, PNG size and titles"
import copy, functools, random
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from aisaac.core.callback import Callback
from aisaac.data import DataLoaders, TensorLoader
from aisaac.models import get_model_conv
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB, DeviceCB
from aisaac.callbacks.summary import ModelSummary
from aisaac.callbacks.augment import UnNormalize


def image_dls(n=48, bs=16, seed=0, loader='torch'):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    if loader == 'tensor': return DataLoaders(TensorLoader(x, y, bs=bs, shuffle=True, seed=1), TensorLoader(x, y, bs=bs))
    return DataLoaders(DataLoader(TensorDataset(x, y), bs, shuffle=True), DataLoader(TensorDataset(x, y), bs))


def bn_model():
    return nn.Sequential(nn.Conv2d(1, 4, 3, 2, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(), nn.Linear(4*14*14, 10))


class Counter(Callback):
    "Counts the events a metrics-like callback would see"
    def before_fit(self, trainer): self.fits = getattr(self, 'fits', 0) + 1
    def after_batch(self, trainer): self.batches = getattr(self, 'batches', 0) + 1


def trained(loader='torch', seed=0, model=bn_model):
    torch.manual_seed(seed)
    t = Trainer(image_dls(loader=loader), nn.CrossEntropyLoss(), torch.optim.Adam, model(),
                callbacks=[BasicTrainCB(), DeviceCB('cpu'), Counter()])
    t.fit(1, lr=1e-3)
    return t


def snapshot(t):
    return (copy.deepcopy(t.model.state_dict()), copy.deepcopy(t.opt.state_dict()), torch.get_rng_state(),
            random.getstate(), np.random.get_state()[1].copy(), t.model.training, t.epoch, t.opt)


def assert_same(a, b):
    for k in a[0]: assert torch.equal(a[0][k], b[0][k]), k  # weights and batch-norm buffers
    assert str(a[1]) == str(b[1])  # optimizer state
    assert torch.equal(a[2], b[2]) and a[3] == b[3] and (a[4] == b[4]).all()  # torch, Python and NumPy random states
    assert a[5:] == b[5:]  # model mode, the trainer's counters, the same optimizer object


@pytest.mark.parametrize('loader', ['torch', 'tensor'])
def test_summary_trains_nothing_and_leaves_the_random_state(loader):
    t = trained(loader)
    before = snapshot(t)
    s = t.summarize_model()
    assert_same(before, snapshot(t))
    assert t.Counter.fits == 1 and t.Counter.batches == 3 + 3  # the summary's batch reached no other callback
    assert sum(len(m._forward_hooks) for m in t.model.modules()) == 0
    assert isinstance(s, ModelSummary)


@pytest.mark.parametrize('loader', ['torch', 'tensor'])
def test_a_fit_after_a_summary_is_the_fit_without_it(loader):
    "The shuffled loaders draw the same batches: the summary consumed no randomness"
    a, b = trained(loader), trained(loader)
    b.summary(); b.peek_batch(); b.peek_batch(train=False)
    torch.manual_seed(5); a.fit(1); torch.manual_seed(5); b.fit(1)
    for k, v in a.model.state_dict().items(): assert torch.equal(v, b.model.state_dict()[k]), k


def test_summary_numbers_on_a_linear_model():
    x, y = torch.randn(5, 4), torch.randn(5, 3)
    t = Trainer(DataLoaders([(x, y)], [(x, y)]), nn.MSELoss(), torch.optim.SGD,
                nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 3, bias=False))), callbacks=[BasicTrainCB()])
    t.model[0].weight.requires_grad_(False)
    s = t.summarize_model()
    assert [r[0].strip() for r in s] == ['0 Linear', '1 ReLU', '2 Sequential', '2.0 Linear']
    assert [r[1:4] for r in s] == [((5, 4), (5, 8), '40'), ((5, 8), (5, 8), '0'), ((5, 8), (5, 3), '24'), ((5, 8), (5, 3), '24')]
    assert [r[4] for r in s] == [f'{2*5*4*8/1e6:.2f}', '0.00', f'{2*5*8*3/1e6:.2f}', f'{2*5*8*3/1e6:.2f}']
    assert (s.params, s.trainable, s.flops) == (40 + 24, 8 + 24, 2*5*4*8 + 2*5*8*3)
    assert len(t.summarize_model(depth=1)) == 3
    text, md = repr(s), s._repr_markdown_()
    assert text.splitlines()[0].split() == ['module', 'input', 'output', 'params', 'MFLOPs']
    assert 'Total params: 64 (32 trainable); MFLOPs per batch: 0.0' in text and text == str(s)
    assert md.splitlines()[:2] == ['| module | input | output | params | MFLOPs |', '| --- | --- | --- | --- | --- |']
    assert '| 2.0 Linear | (5, 8) | (5, 3) | 24 | 0.00 |' in md.replace('|   2.0', '| 2.0')


def test_peek_batch_runs_only_the_callbacks_that_prepare_batches():
    class Scale(Callback):
        def after_dataloader(self, trainer): trainer.batch = (trainer.batch[0] * 3, trainer.batch[1])
    t = trained()
    t.add_callbacks(Scale())
    with torch.random.fork_rng(): first = next(iter(t.dls.valid))
    xb, yb = t.peek_batch(train=False)
    assert torch.equal(xb, first[0] * 3) and torch.equal(yb, first[1])
    assert t.Counter.fits == 1
    t.dls = DataLoaders([], [])
    with pytest.raises(ValueError, match=r'`dls.train` gave no batch .*it is empty'): t.peek_batch()


# Images ---------------------------------------------------------------------------------------------------------------
from PIL import Image
from aisaac.data import load_fashion_mnist, sample_dataset_dict, pil_to_tensor, collate_dict
from aisaac.callbacks.visualize import ImageVisualizerCB, class_names, find_denorm

XMEAN, XSTD = 0.28, 0.35


@functools.lru_cache
def fmnist_dls(n_valid=24, bs=8, with_classes=True):
    "A small Fashion-MNIST sample, normalised in the dataset transform, over torch DataLoaders of the HF datasets"
    def tfm(b):
        b['image'] = [(pil_to_tensor(o) - XMEAN) / XSTD for o in b['image']]
        return b
    dsd = sample_dataset_dict(load_fashion_mnist(), n_train=32, n_valid=n_valid).with_transform(tfm)
    if with_classes: return DataLoaders.from_dataset_dict(dsd, bs)
    mk = lambda ds, shuffle: DataLoader(ds, bs, shuffle=shuffle, collate_fn=collate_dict(ds))
    return DataLoaders(mk(dsd['train'], True), mk(dsd['test'], False))


class KeepFigures(Callback):
    "A logger that takes images: keeps what log_image gets"
    def before_fit(self, trainer): self.got = []
    def log_image(self, trainer, name, image, step):
        self.got.append((name, step, [ax.get_title() for ax in image.axes if ax.images], (image.get_size_inches() * image.dpi).tolist()))


def fmnist_trainer(dls, *cbs):
    torch.manual_seed(0)
    return Trainer(dls, nn.CrossEntropyLoss(), torch.optim.Adam, get_model_conv(), callbacks=[BasicTrainCB(), DeviceCB('cpu'), *cbs])


@pytest.mark.parametrize('with_classes', [True, False])
def test_image_grid_png_has_the_expected_size_and_titles_from_the_class_names(tmp_path, with_classes):
    dls = fmnist_dls(with_classes=with_classes)
    names = dls.valid.dataset.features['label'].names
    assert class_names(dls) == names  # from `classes`, or from the validation dataset's ClassLabel feature
    keep = KeepFigures()
    t = fmnist_trainer(dls, ImageVisualizerCB(folder=tmp_path, show=False), keep)
    t.fit(2, lr=1e-3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['predictions_epoch_0.png', 'predictions_epoch_1.png']
    with Image.open(tmp_path/'predictions_epoch_1.png') as im: assert im.size == (600, 600)  # 3x3 images of 2 inches at 100 dpi
    (name, step, titles, size), = keep.got[1:]
    assert (name, step, size) == ('predictions', 1, [600, 600])
    xb, yb = (torch.cat(o)[:9] for o in zip(*list(dls.valid)[:2]))  # 9 images: the first two batches of 8
    with torch.no_grad(): preds = t.model(xb).argmax(1)
    assert titles == [f'true: {names[y]}\npred: {names[p]}' for y, p in zip(yb.tolist(), preds.tolist())]


def test_visualizer_size_count_interval_and_no_file_when_folder_is_none(tmp_path):
    keep = KeepFigures()
    viz = ImageVisualizerCB(n=4, every_n_epochs=2, folder=tmp_path, imsize=1.5, dpi=80, show=False)
    t = fmnist_trainer(fmnist_dls(n_valid=6, bs=3), viz, keep)  # 4 images come from two validation batches
    t.fit(3, lr=1e-3)
    assert [p.name for p in viz.paths] == ['predictions_epoch_1.png']
    with Image.open(viz.paths[0]) as im: assert im.size == (240, 240)  # 2x2 images of 1.5 inches at 80 dpi
    assert [(g[1], len(g[2])) for g in keep.got] == [(1, 4)]
    t.fit(1)  # the epochs go on across fits: this is the fourth, drawn
    assert [p.name for p in viz.paths] == ['predictions_epoch_1.png', 'predictions_epoch_3.png']
    t.remove_callbacks([viz])
    t.fit(1, callbacks=[ImageVisualizerCB(folder=None, show=False)])
    assert len(list(tmp_path.iterdir())) == 2
    with pytest.raises(ValueError, match='at least 1'): ImageVisualizerCB(every_n_epochs=0)


def test_tensorboard_logger_receives_the_grid(tmp_path):
    pytest.importorskip('tensorboard')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from aisaac.callbacks.trackers import TensorBoardLogger
    t = fmnist_trainer(fmnist_dls(), ImageVisualizerCB(folder=None, show=False), TensorBoardLogger(tmp_path/'tb'))
    t.fit(1, lr=1e-3)
    acc = EventAccumulator(str(tmp_path/'tb'), size_guidance={'images': 0}); acc.Reload()
    (ev,) = acc.Images('predictions')
    assert (ev.step, ev.width, ev.height) == (0, 600, 600)


def test_show_image_batch_is_the_prepared_batch_unnormalised_with_class_names():
    class Normalised(Callback):
        "A callback that knows the normalisation, as a normalising callback would"
        def denorm(self, x): return x * XSTD + XMEAN
    dls = fmnist_dls()
    t = fmnist_trainer(dls, Normalised())
    assert find_denorm(t)(torch.zeros(1)).item() == pytest.approx(XMEAN)
    t.show_image_batch(max_n=5)
    fig = plt.gcf()
    axs = [ax for ax in fig.axes if ax.images]
    xb, yb = t.peek_batch()
    assert [ax.get_title() for ax in axs] == [dls.classes[y] for y in yb[:5].tolist()]
    np.testing.assert_allclose(axs[0].images[0].get_array(), (xb[0, 0] * XSTD + XMEAN).numpy(), atol=1e-6)
    plt.close(fig)
    t.show_image_batch(max_n=2, denorm=UnNormalize(XMEAN, XSTD))  # an in-place denorm leaves the trainer's batch alone
    assert torch.equal(t.batch[0], xb)
    t.show_image_batch(max_n=2, denorm=lambda x: x * 0)  # an explicit denorm wins
    assert plt.gcf().axes[0].images[0].get_array().max() == 0
    plt.close('all')

def test_a_resumed_run_numbers_its_images_by_the_runs_epochs_and_a_validation_only_fit_draws_none(tmp_path):
    "Fit 2 epochs with checkpoints, resume to 4 in a new trainer: predictions_epoch_0..3, none overwritten (before: the resumed epochs wrote _0 and _1 again); `capture_preds` (a fit that only validates) draws nothing (before: an image numbered as the next epoch)"
    from aisaac.callbacks.savers import CheckpointCB
    import aisaac.callbacks.preds  # (`trainer.capture_preds`)
    dls = fmnist_dls(n_valid=6, bs=3)
    t = fmnist_trainer(dls, ImageVisualizerCB(n=4, folder=tmp_path/'img', show=False), CheckpointCB(tmp_path/'ck', keep_last=None))
    t.fit(2, lr=1e-3)
    first = (tmp_path/'img'/'predictions_epoch_1.png').read_bytes()
    t.capture_preds()
    again = fmnist_trainer(dls, ImageVisualizerCB(n=4, folder=tmp_path/'img', show=False), CheckpointCB(tmp_path/'ck2', keep_last=None))
    again.fit(4, lr=1e-3, resume_from=tmp_path/'ck'/'checkpoint_0002_000000.pt')
    assert sorted(p.name for p in (tmp_path/'img').iterdir()) == [f'predictions_epoch_{e}.png' for e in range(4)]
    assert (tmp_path/'img'/'predictions_epoch_1.png').read_bytes() == first
