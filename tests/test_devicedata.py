"""`DeviceLoader` on the CPU (the same code as on a GPU, `device='cpu'`): its batches, the determinism of its augmentations, that
a batch is never a view of the data, and exact resume of a fit in the middle of an epoch, the batches after the resume those of a
run that never stopped. On a GPU: tests/test_cuda.py."""
import pytest
import torch
from torch import nn
from aisaac.core.callback import Callback
from aisaac.data import DataLoaders
from aisaac.checkpoint import loader_generators
from aisaac.devicedata import DeviceLoader, FlipLR, Translate, Cutout, device_dataloaders
from aisaac.callbacks.graphplan import EagerGraphs
from aisaac.callbacks.graphs import CUDAGraphCB
from graph_fits import make_trainer, weights, StopAt

def images(n=96, seed=0):
    "`n` random 1x8x8 images and 4 classes"
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)

def epochs(dl, n=3): return [[tuple(t.clone() for t in b) for b in dl] for _ in range(n)]

def same(a, b): return len(a) == len(b) and all(len(x) == len(y) and all(torch.equal(s, t) for p, q in zip(x, y) for s, t in zip(p, q)) for x, y in zip(a, b))

def test_every_row_once_per_epoch_in_a_new_order_each_epoch():
    x, y = torch.arange(50.)[:, None], torch.arange(50)
    dl = DeviceLoader(x, y, bs=8, shuffle=True, seed=0, device='cpu')
    es = epochs(dl)
    assert len(dl) == 7 and [len(b[1]) for b in es[0]] == [8] * 6 + [2]
    orders = [torch.cat([b[1] for b in e]).tolist() for e in es]
    assert all(sorted(o) == list(range(50)) for o in orders) and len({tuple(o) for o in orders}) == 3
    assert all(torch.equal(b[0][:, 0].long(), b[1]) for e in es for b in e)  # the rows stay together
    assert [len(b[1]) for b in DeviceLoader(x, y, bs=8, drop_last=True)] == [8] * 6
    assert torch.cat([b[1] for b in DeviceLoader(x, y, bs=8)]).tolist() == list(range(50))  # not shuffled: in order

def test_the_same_seed_gives_the_same_batches_and_augmentations_another_seed_others():
    x, y = images()
    tfms = lambda: [FlipLR(), Translate(2), Cutout(3)]
    a = epochs(DeviceLoader(x, y, bs=16, shuffle=True, tfms=tfms(), seed=1))
    assert same(a, epochs(DeviceLoader(x, y, bs=16, shuffle=True, tfms=tfms(), seed=1)))
    assert not same(a, epochs(DeviceLoader(x, y, bs=16, shuffle=True, tfms=tfms(), seed=2)))
    assert not same(a[:1], a[1:2])  # another epoch, another augmentation
    torch.manual_seed(5); b = epochs(DeviceLoader(x, y, bs=16, shuffle=True, tfms=tfms()))
    torch.manual_seed(5); assert same(b, epochs(DeviceLoader(x, y, bs=16, shuffle=True, tfms=tfms())))  # no seed: drawn from torch's

def test_augmentations_change_the_inputs_only_and_draw_from_the_generator_alone():
    x, y = images()
    dl = DeviceLoader(x, y, bs=96, tfms=[FlipLR(), Translate(2), Cutout(3)], seed=0)
    state = torch.get_rng_state()
    (xb, yb), = list(dl)
    assert torch.equal(torch.get_rng_state(), state)  # torch's global generator untouched
    assert torch.equal(yb, y) and not torch.equal(xb, x) and xb.shape == x.shape
    assert ((xb == 0).flatten(1).sum(1) >= 3).all()  # each image has its cutout (at least a clipped corner)

def test_a_batch_is_a_copy_never_a_view_of_the_data():
    x, y = images()
    x0, y0 = x.clone(), y.clone()
    for dl in (DeviceLoader(x, y, bs=16), DeviceLoader(x, y, bs=16, shuffle=True, seed=0), DeviceLoader(x, y, bs=16, tfms=[FlipLR()], seed=0)):
        for xb, yb in dl:
            xb.fill_(7.); yb.fill_(7)
        assert torch.equal(dl.tensors[0], x0) and torch.equal(dl.tensors[1], y0)

def test_bad_augmentations_are_refused():
    x, y = images()
    with pytest.raises(TypeError, match=r"DeviceLoader's `tfms` are callables `tfm\(x, generator\)`"): DeviceLoader(x, y, tfms=['flip'])

def test_its_generator_is_the_one_checkpoints_keep():
    x, y = images()
    dls = DataLoaders(DeviceLoader(x, y, bs=16, shuffle=True, seed=0), DeviceLoader(x, y, bs=32))
    gens = loader_generators(dls)
    assert len(gens) == 2 and gens[0] is dls.train.generator and gens[0].device.type == 'cpu'

class Seen(Callback):
    "Every training batch, as the model gets it"
    cuda_graph = 'host'
    def before_fit(self, t): self.batches = []
    def after_batch(self, t):
        if t.training: self.batches.append(tuple(b.clone() for b in t.batch))

def conv(): return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 4))

def device_dls():
    (x, y), (xv, yv) = images(), images(32, 1)
    return DataLoaders(DeviceLoader(x, y, bs=16, shuffle=True, tfms=[FlipLR(), Translate(1), Cutout(2)], seed=3, device='cpu'),
                       DeviceLoader(xv, yv, bs=32, device='cpu'))

@pytest.mark.parametrize('graph', [False, True])
def test_a_fit_resumed_inside_an_epoch_sees_the_batches_of_a_run_that_never_stopped(tmp_path, graph):
    "Stopped after training batch 2 of epoch 1 (of 6 a pass), resumed: the same batches (orders and augmentations) and weights, with CUDAGraphCB too"
    extra = lambda: [CUDAGraphCB(backend=EagerGraphs())] if graph else []
    def run(*cbs, resume=None):
        seen = Seen()
        t = make_trainer(seen, *extra(), *cbs, dls=device_dls(), model=conv)
        t.fit(3, lr=1e-2, resume_from=resume)
        return t, seen.batches
    t, straight = run()
    run(StopAt(tmp_path/'c.pt', 1, 2))
    t2, resumed = run(resume=tmp_path/'c.pt')
    assert len(straight) == 18 and len(resumed) == 18 - 9
    assert same([straight[9:]], [resumed])
    assert torch.equal(weights(t.model), weights(t2.model))

def test_device_dataloaders_from_a_dataset_dict(fmnist_sample):
    dls = device_dataloaders(fmnist_sample, 64, tfms=[FlipLR(), Translate(2)], seed=0, device='cpu')
    (xb, yb), (xv, yv) = next(iter(dls.train)), next(iter(dls.valid))
    assert isinstance(dls.train, DeviceLoader) and isinstance(dls.valid, DeviceLoader)
    assert xb.shape == (64, 1, 28, 28) and len(xv) == 128 and dls.classes[0] == 'T - shirt / top'
    assert dls.train.shuffle and not dls.valid.shuffle and dls.valid.tfms == []

@pytest.fixture(scope='module')
def fmnist_sample():
    from aisaac.data import load_fashion_mnist, pil_to_tensor, sample_dataset_dict, DataNotFoundError
    from aisaac.utils import inplace
    try: dsd = load_fashion_mnist()
    except DataNotFoundError as e: pytest.skip(str(e))
    @inplace
    def tfm(b): b['image'] = [(pil_to_tensor(o) - 0.28) / 0.35 for o in b['image']]
    return sample_dataset_dict(dsd, 256, 256).with_transform(tfm)
