"Tests of `aisaac.data`: finding and reading Fashion-MNIST, and the loaders."
import gzip, struct
from pathlib import Path
import numpy as np, pytest, torch
from datasets import Dataset, DatasetDict, ClassLabel, Image
import aisaac.data as data
from aisaac.data import (DataNotFoundError, DataLoaders, TensorLoader, fashion_classes, find_idx,
                         load_fashion_mnist, pil_to_tensor, read_idx, sample_dataset_dict)
from aisaac.utils import inplace, set_seed

debian = data.fashion_mnist_dir
needs_debian = pytest.mark.skipif(find_idx(debian) is None, reason=f"Fashion-MNIST IDX files not in {debian}")

def write_idx(fn, arr, gz=False):
    codes = {np.dtype('uint8'): 0x08, np.dtype('>i4'): 0x0C}
    raw = struct.pack('>HBB', 0, codes[arr.dtype], arr.ndim) + struct.pack(f'>{arr.ndim}I', *arr.shape) + arr.tobytes()
    Path(fn).write_bytes(gzip.compress(raw) if gz else raw)

def write_fake_fashion(folder, n_train=6, n_test=4, gz=True):
    "Four tiny Fashion-MNIST-like IDX files in `folder`; returns the arrays"
    rng = np.random.default_rng(0)
    res = {}
    for pre, n in (('train', n_train), ('t10k', n_test)):
        imgs, lbls = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), (np.arange(n) % 10).astype(np.uint8)
        sfx = '.gz' if gz else ''
        write_idx(Path(folder)/f'{pre}-images-idx3-ubyte{sfx}', imgs)
        write_idx(Path(folder)/f'{pre}-labels-idx1-ubyte{sfx}', lbls)
        res[pre] = imgs, lbls
    return res

@pytest.fixture
def isolated(tmp_path, monkeypatch):
    "No data anywhere: empty default folder, no `AISAAC_DATA`, HF offline, a private cache"
    monkeypatch.setattr(data, 'fashion_mnist_dir', tmp_path/'nothing-here')
    monkeypatch.delenv('AISAAC_DATA', raising=False)
    monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
    monkeypatch.setenv('AISAAC_CACHE', str(tmp_path/'cache'))
    return tmp_path

# --- reading

@pytest.mark.parametrize('gz', [False, True])
def test_read_idx(tmp_path, gz):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path/'x-idx3-ubyte', arr, gz)
    np.testing.assert_array_equal(read_idx(tmp_path/'x-idx3-ubyte'), arr)
    ints = np.array([1, -2, 70000], dtype='>i4')
    write_idx(tmp_path/'i-idx1-int', ints, gz)
    np.testing.assert_array_equal(read_idx(tmp_path/'i-idx1-int'), [1, -2, 70000])

def test_read_idx_rejects_other_files(tmp_path):
    (tmp_path/'junk').write_bytes(b'hello world')
    with pytest.raises(ValueError, match='not an IDX file'): read_idx(tmp_path/'junk')

def test_load_from_path_and_env(isolated, monkeypatch):
    src = isolated/'fake'; src.mkdir()
    arrs = write_fake_fashion(src, gz=False)
    dsd = load_fashion_mnist(src)
    assert {k: len(v) for k, v in dsd.items()} == {'train': 6, 'test': 4}
    assert dsd['train'].features['label'].names == fashion_classes
    np.testing.assert_array_equal(np.asarray(dsd['test'][3]['image']), arrs['t10k'][0][3])
    assert dsd['test'][3]['label'] == 3
    assert len(list((isolated/'cache').glob('fashion_mnist-*'))) == 1   # written to the disk cache
    monkeypatch.setenv('AISAAC_DATA', str(src))
    assert load_fashion_mnist()['train']['label'] == dsd['train']['label']

def test_disk_cache_used_by_new_loads(isolated):
    src = isolated/'fake'; src.mkdir()
    write_fake_fashion(src)
    load_fashion_mnist(src)
    data._loaded.clear()   # as in a new process
    dsd = load_fashion_mnist(src)
    assert str(isolated/'cache') in dsd['train'].cache_files[0]['filename']

# --- errors

def test_nothing_found_is_one_clear_error(isolated):
    with pytest.raises(DataNotFoundError) as e: load_fashion_mnist()
    msg = str(e.value)
    assert isinstance(e.value, FileNotFoundError)
    for part in ('apt-get install dataset-fashion-mnist', 'AISAAC_DATA', 'Hugging Face hub', 'offline'): assert part in msg

def test_empty_path_is_an_error_naming_it(isolated):
    empty = isolated/'empty'; empty.mkdir()
    with pytest.raises(DataNotFoundError, match='empty'): load_fashion_mnist(empty)

def test_empty_env_folder_is_an_error_naming_it(isolated, monkeypatch):
    monkeypatch.setenv('AISAAC_DATA', str(isolated/'nowhere'))
    with pytest.raises(DataNotFoundError, match='AISAAC_DATA.*nowhere'): load_fashion_mnist()

def test_no_validation_split():
    ds = Dataset.from_dict({'x': [1, 2], 'y': [0, 1]})
    with pytest.raises(ValueError, match=r"\['train', 'extra'\].*'valid', 'validation', 'test'"):
        DataLoaders.from_dataset_dict(DatasetDict(train=ds, extra=ds), 2)

# --- the fast loader

def epoch(dl): return torch.cat([b[0] for b in dl])

def test_tensor_loader_each_item_once_new_order_each_epoch():
    x = torch.arange(100)
    dl = TensorLoader(x, -x, bs=16, shuffle=True, seed=1)
    assert len(dl) == 7 and dl.n == 100 and len(dl.dataset) == 100
    e1, e2 = epoch(dl), epoch(dl)
    assert torch.equal(e1.sort().values, x) and torch.equal(e2.sort().values, x)
    assert not torch.equal(e1, e2)
    assert all(torch.equal(yb, -xb) for xb, yb in dl)

def test_tensor_loader_reproducible():
    x = torch.arange(50)
    a, b = TensorLoader(x, bs=8, shuffle=True, seed=3), TensorLoader(x, bs=8, shuffle=True, seed=3)
    for _ in range(2): assert torch.equal(epoch(a), epoch(b))
    set_seed(7); g1 = epoch(TensorLoader(x, bs=8, shuffle=True))
    set_seed(7); g2 = epoch(TensorLoader(x, bs=8, shuffle=True))
    assert torch.equal(g1, g2)

def test_tensor_loader_drop_last_and_order():
    x = torch.arange(10)
    assert [len(b[0]) for b in TensorLoader(x, bs=4)] == [4, 4, 2]
    dl = TensorLoader(x, bs=4, drop_last=True)
    assert len(dl) == 2 and [len(b[0]) for b in dl] == [4, 4]
    assert torch.equal(epoch(TensorLoader(x, bs=3)), x)
    dl = TensorLoader(x, bs=4, shuffle=True, drop_last=True, seed=0)
    assert len(epoch(dl).unique()) == 8
    assert torch.equal(next(iter(TensorLoader(x, bs=2, tfm=lambda b: (b[0]*10,))))[0], torch.tensor([0, 10]))
    with pytest.raises(ValueError, match='same length'): TensorLoader(x, x[:3])

# --- DataLoaders on a small real-looking dataset

@pytest.fixture
def fake_dsd(isolated):
    src = isolated/'fake'; src.mkdir()
    write_fake_fashion(src, n_train=100, n_test=30)
    return load_fashion_mnist(src)

xmean, xstd = 0.28, 0.35
@inplace
def transformi(b): b['image'] = [(pil_to_tensor(o)-xmean)/xstd for o in b['image']]

def test_fast_path_matches_with_transform_path(fake_dsd):
    tds = fake_dsd.with_transform(transformi)
    slow = DataLoaders.from_dataset_dict(tds, 16)
    fast = DataLoaders.from_dataset_dict(tds, 16, fast=True, seed=0)
    raw = DataLoaders.from_dataset_dict(fake_dsd, 16, fast=True)
    assert len(slow.train) == len(fast.train) == 7
    for (xs, ys), (xf, yf), (xr, _) in zip(slow.valid, fast.valid, raw.valid):   # valid: same order
        assert xs.shape == xf.shape == (xs.shape[0], 1, 28, 28) and ys.dtype == yf.dtype == torch.int64
        assert torch.equal(ys, yf) and torch.allclose(xs, xf) and torch.allclose((xr-xmean)/xstd, xf, atol=1e-6)
    key = lambda xs, ys: sorted(zip(ys.tolist(), xs.flatten(1).sum(1).round(decimals=3).tolist()))
    (xs, ys), (xf, yf) = [[torch.cat(o) for o in zip(*dl)] for dl in (slow.train, fast.train)]   # one pass each
    assert key(xs, ys) == key(xf, yf)   # train: same items, shuffled

def test_sample_keeps_features_and_transform(fake_dsd):
    s = sample_dataset_dict(fake_dsd.with_transform(transformi), n_train=10, n_valid=5, seed=1)
    assert {k: len(v) for k, v in s.items()} == {'train': 10, 'test': 5}
    assert s['train'].features == fake_dsd['train'].features
    assert s['train'][0]['image'].shape == (1, 28, 28)
    assert s['train']['label'] == sample_dataset_dict(fake_dsd, 10, 5, seed=1)['train']['label']

# --- the disk cache of converted tensors

converted = []  # images converted by `Shift` transforms, counted outside them (their hash must not change)

class Shift:
    "A `with_transform` function: images as tensors plus `shift`"
    def __init__(self, shift): self.shift = shift
    def __call__(self, b):
        converted.append(len(b['image']))
        return {**b, 'image': [pil_to_tensor(o) + self.shift for o in b['image']]}

def cached_files(root): return sorted((root/'cache'/'tensors').glob('*.pt'))

def test_second_run_loads_converted_tensors_from_disk(fake_dsd, isolated):
    converted.clear()
    ds = fake_dsd['train'].with_transform(Shift(0.5))
    x, y = data.to_tensors(ds)
    assert sum(converted) == 100 and len(cached_files(isolated)) == 1
    data._converted.clear()  # what a new process starts with
    ds2 = load_fashion_mnist(isolated/'fake')['train'].with_transform(Shift(0.5))
    x2, y2 = data.to_tensors(ds2)
    assert sum(converted) == 100 + 1  # not converted again: one row only, to check that the loaded tensors match the split
    assert torch.equal(x, x2) and torch.equal(y, y2) and y2.dtype == torch.int64

def test_disk_cache_key_follows_transform_and_columns(fake_dsd, isolated):
    converted.clear()
    data.to_tensors(fake_dsd['train'].with_transform(Shift(0.5)))
    data._converted.clear()
    x = data.to_tensors(fake_dsd['train'].with_transform(Shift(0.25)))[0]  # another transform
    assert sum(converted) == 200 and len(cached_files(isolated)) == 2
    assert torch.allclose(x, data.to_tensors(fake_dsd['train'], cache=False)[0] + 0.25)
    data._converted.clear()
    data.to_tensors(fake_dsd['train'].select_columns(['label']))
    assert len(cached_files(isolated)) == 3  # the label column alone is a third file (`cache=False` above wrote none)

def test_no_disk_cache_for_in_memory_splits_or_unhashable_transforms(fake_dsd, isolated):
    mem = Dataset.from_dict({'x': [[1., 2.], [3., 4.]], 'y': [0, 1]})
    assert torch.equal(data.to_tensors(mem)[0], torch.tensor([[1., 2.], [3., 4.]]))
    ids = (i for i in range(10**6))  # a generator cannot be pickled, so the transform cannot be hashed
    def tfm(b): return {**b, 'image': [pil_to_tensor(o) + 0 * next(ids) for o in b['image']]}
    data.to_tensors(fake_dsd['test'].with_transform(tfm))
    data.to_tensors(fake_dsd['test'], cache=False)
    assert cached_files(isolated) == []

def test_unreadable_cache_file_is_converted_again(fake_dsd, isolated):
    converted.clear()
    data.to_tensors(fake_dsd['test'].with_transform(Shift(0.5)))
    [fn] = cached_files(isolated)
    fn.write_bytes(b'not a tensor file')
    data._converted.clear()
    with pytest.warns(UserWarning, match='unreadable tensor cache'):
        x = data.to_tensors(fake_dsd['test'].with_transform(Shift(0.5)))[0]
    assert sum(converted) == 60 and x.shape == (30, 1, 28, 28)
    data._converted.clear()
    data.to_tensors(fake_dsd['test'].with_transform(Shift(0.5)))  # rewritten: read, not converted
    assert sum(converted) == 60 + 1  # rewritten: read (and checked against one row), not converted

def test_unwritable_cache_warns_and_still_loads(fake_dsd, isolated, monkeypatch):
    (isolated/'not-a-folder').write_text('a file where the cache folder should be')
    monkeypatch.setenv('AISAAC_CACHE', str(isolated/'not-a-folder'))
    with pytest.warns(UserWarning, match='Could not write the tensor cache'): x, y = data.to_tensors(fake_dsd['train'])  # a split on disk
    assert x.shape == (100, 1, 28, 28)
    src = isolated/'other'; src.mkdir()
    write_fake_fashion(src, n_train=10, n_test=4)
    with pytest.warns(UserWarning, match='Could not write the data cache'): dsd = load_fashion_mnist(src)
    assert len(dsd['train']) == 10 and not list(isolated.glob('**/.tmp-*'))

def test_show_batch(fake_dsd):
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    DataLoaders.from_dataset_dict(fake_dsd, 16, fast=True).show_batch(n=4, ncols=2)
    titles = [ax.get_title() for ax in plt.gcf().axes]
    assert len(titles) == 4 and all(t in fashion_classes for t in titles)
    plt.close('all')

# --- the real data (Debian package)

@needs_debian
def test_fashion_mnist_schema(monkeypatch):
    monkeypatch.delenv('AISAAC_DATA', raising=False)
    dsd = load_fashion_mnist()
    assert {k: len(v) for k, v in dsd.items()} == {'train': 60000, 'test': 10000}
    feats = dsd['train'].features
    assert list(feats) == ['image', 'label'] and isinstance(feats['image'], Image) and isinstance(feats['label'], ClassLabel)
    assert feats['label'].names == ['T - shirt / top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt',
                                    'Sneaker', 'Bag', 'Ankle boot']
    img = dsd['train'][0]['image']
    assert (img.mode, img.size) == ('L', (28, 28)) and dsd['train'][0]['label'] == 9   # the first image is an ankle boot
