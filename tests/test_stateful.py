"""Loaders that say their state resume at once: the checkpoint keeps the training loader's `state_dict` and a resume gives it back,
instead of fetching every batch already trained and dropping it. torchdata's `StatefulDataLoader` with 2 worker processes, a Hugging
Face iterable dataset and aisaac's `TensorLoader` resume inside an epoch (in a run of epochs and in one measured in steps) with the
uninterrupted run's batches and weights, and fetch none of the batches trained before the checkpoint (before: all of them). A loader
that cannot say its state still replays, and says so once, naming itself and the batches it replays."""
import types, warnings
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.data import TensorLoader
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.savers import CheckpointCB

torch.set_num_threads(1)
N, BS = 96, 8  # 12 batches an epoch

class Rows(Dataset):
    "Rows `(x, y)`; counts the fetches of each row in shared memory, so that worker processes' fetches count too"
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(N, 4, generator=g), torch.randn(N, 1, generator=g)
        self.x[:, 0] = torch.arange(N) / N  # the row's number (over N), to see which rows a batch holds
        self.fetched = torch.zeros(N, dtype=torch.int32).share_memory_()
    def __len__(self): return N
    def __getitem__(self, i):
        self.fetched[i] += 1
        return self.x[i], self.y[i]

class Seen(Callback):
    "The training batches, as the numbers of their rows"
    def __init__(self): self.batches = []
    def after_dataloader(self, t):
        if t.model.training: self.batches.append(rows(t.batch[0]))

def stateful_loader(workers=2):
    from torchdata.stateful_dataloader import StatefulDataLoader
    ds = Rows()
    return StatefulDataLoader(ds, batch_size=BS, shuffle=True, num_workers=workers), ds

def plain_loader(workers=2):
    ds = Rows()
    return DataLoader(ds, batch_size=BS, shuffle=True, num_workers=workers), ds

def trainer(make, *cbs):
    torch.manual_seed(0)  # the model's weights, and the seed a `StatefulDataLoader`'s sampler draws
    dl, ds = make()
    seen = Seen()
    t = Trainer(types.SimpleNamespace(train=dl, valid=[]), nn.MSELoss(), torch.optim.SGD, nn.Linear(4, 1), callbacks=[BasicTrainCB(), seen, *cbs])
    return t, seen, ds

def rows(x): return (x[:, 0] * N).round().long().tolist()

def weights(t): return [p.detach().clone() for p in t.model.parameters()]

def run_and_resume(make, tmp_path, fit, ckpt):
    "The uninterrupted run and the one resumed from its checkpoint `ckpt`: (uninterrupted's batches, resumed's, their weights, resumed's dataset)"
    every = {'every': '1 steps'} if 'steps' in fit else {'every_n_batches': 1}
    t, seen, _ = trainer(make, CheckpointCB(tmp_path, every_n_epochs=None, keep_last=None, **every))
    t.fit(lr=0.1, valid=False, **fit)
    r, rseen, rds = trainer(make)
    r.fit(lr=0.1, valid=False, resume_from=tmp_path/ckpt, **fit)
    return seen.batches, rseen.batches, (weights(t), weights(r)), rds

@pytest.mark.parametrize('fit, ckpt, done', [({'n_epochs': 2}, 'checkpoint_0001_000005.pt', 12 + 5),
                                              ({'steps': 20, 'valid_every': 10}, 'checkpoint_step_000015.pt', 15)])
def test_a_stateful_dataloader_with_2_workers_resumes_mid_epoch_without_fetching_the_batches_trained(tmp_path, fit, ckpt, done):
    pytest.importorskip('torchdata.stateful_dataloader')
    with warnings.catch_warnings():
        warnings.filterwarnings('error', message='Resuming inside')  # no replay warning
        batches, resumed, (w, rw), ds = run_and_resume(stateful_loader, tmp_path, fit, ckpt)
    assert resumed == batches[done:]
    for a, b in zip(w, rw): torch.testing.assert_close(a, b, rtol=0, atol=0)
    trained = sum(batches[done - done % 12:done], [])  # the rows of this epoch's batches trained before the checkpoint
    assert int(ds.fetched[trained].sum()) == 0  # none fetched again
    assert int(ds.fetched.max()) == 1 and all(ds.fetched[r] == 1 for b in resumed for r in b)  # the rest once (and what the workers prefetched)

@pytest.mark.parametrize('workers', [0, 2])
def test_an_hf_iterable_dataset_resumes_from_its_state(tmp_path, workers):
    "In the main process (a torch `DataLoader`: the dataset says its state), or in 2 workers (a `StatefulDataLoader` keeps each one's)"
    datasets = pytest.importorskip('datasets')
    if workers: pytest.importorskip('torchdata.stateful_dataloader')
    fetched = torch.zeros(N, dtype=torch.int32).share_memory_()  # (counted in the workers too)
    def count(row):
        fetched[int(round(row['x'][0] * N))] += 1
        return row
    def make():
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(N, 4, generator=g), torch.randn(N, 1, generator=g)
        x[:, 0] = torch.arange(N) / N
        ds = datasets.Dataset.from_dict({'x': x.tolist(), 'y': y.tolist()}).to_iterable_dataset(num_shards=4).map(count).with_format('torch')
        collate = lambda rows: (torch.stack([r['x'] for r in rows]), torch.stack([r['y'] for r in rows]))
        if not workers: return DataLoader(ds, batch_size=BS, collate_fn=collate), ds
        from torchdata.stateful_dataloader import StatefulDataLoader
        return StatefulDataLoader(ds, batch_size=BS, collate_fn=collate, num_workers=workers), ds
    t, seen, _ = trainer(make, CheckpointCB(tmp_path, every_n_epochs=None, every_n_batches=1, keep_last=None))
    t.fit(2, lr=0.1, valid=False)
    fetched.zero_()
    r, rseen, _ = trainer(make)
    with warnings.catch_warnings():
        warnings.filterwarnings('error', message='Resuming inside')
        r.fit(2, lr=0.1, valid=False, resume_from=tmp_path/'checkpoint_0001_000005.pt')
    assert rseen.batches == seen.batches[12 + 5:]
    for a, b in zip(weights(t), weights(r)): torch.testing.assert_close(a, b, rtol=0, atol=0)
    trained = sum(seen.batches[12:17], [])
    assert int(fetched[trained].sum()) == 0 and int(fetched.sum()) == (12 - 5) * BS  # before: the 5 batches trained were read again

def test_a_tensor_loader_resumes_from_its_state(tmp_path):
    def make():
        ds = Rows()
        return TensorLoader(ds.x, ds.y, bs=BS, shuffle=True), ds
    batches, resumed, (w, rw), _ = run_and_resume(make, tmp_path, {'n_epochs': 2}, 'checkpoint_0001_000005.pt')
    assert resumed == batches[17:]
    for a, b in zip(w, rw): torch.testing.assert_close(a, b, rtol=0, atol=0)
    tl, _ = make()
    it = iter(tl); [next(it) for _ in range(5)]
    state, rest = tl.state_dict(), [rows(b[0]) for b in it]
    again, _ = make()
    again.load_state_dict(state)
    assert [rows(b[0]) for b in again] == rest  # the same order, from the 6th batch, with no batch drawn before

def test_a_loader_that_cannot_say_its_state_replays_and_says_so_naming_itself(tmp_path):
    t, seen, _ = trainer(plain_loader, CheckpointCB(tmp_path, every_n_epochs=None, every_n_batches=1, keep_last=None))
    t.fit(2, lr=0.1, valid=False)
    r, rseen, rds = trainer(plain_loader)
    with pytest.warns(UserWarning) as record: r.fit(2, lr=0.1, valid=False, resume_from=tmp_path/'checkpoint_0001_000005.pt')
    notes = [str(w.message) for w in record if 'replays' in str(w.message)]
    assert len(notes) == 1, notes
    assert 'replays 5 batches of the training loader `DataLoader` with 2 worker processes over a `Rows`' in notes[0]
    assert 'StatefulDataLoader' in notes[0]
    assert rseen.batches == seen.batches[17:]  # still exact
    assert int(rds.fetched.sum()) == N  # the replay fetched the 5 batches trained, and dropped them

def test_a_dataloader_without_workers_skips_by_index_and_says_nothing(tmp_path):
    t, seen, _ = trainer(lambda: plain_loader(0), CheckpointCB(tmp_path, every_n_epochs=None, every_n_batches=1, keep_last=None))
    t.fit(2, lr=0.1, valid=False)
    r, rseen, rds = trainer(lambda: plain_loader(0))
    with warnings.catch_warnings():
        warnings.filterwarnings('error', message='Resuming inside')
        r.fit(2, lr=0.1, valid=False, resume_from=tmp_path/'checkpoint_0001_000005.pt')
    assert rseen.batches == seen.batches[17:] and int(rds.fetched.sum()) == (12 - 5) * BS

def test_a_stateful_dataloader_over_a_distributed_sampler_resumes_in_its_epochs_order(tmp_path):
    "The sampler is told the epoch (`set_sampler_epoch`) before the loader's state fast-forwards it: epoch 1's order, from batch 5"
    pytest.importorskip('torchdata.stateful_dataloader')
    from torch.utils.data import DistributedSampler
    from torchdata.stateful_dataloader import StatefulDataLoader
    def make():
        ds = Rows()
        return StatefulDataLoader(ds, batch_size=BS, sampler=DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0), num_workers=2), ds
    batches, resumed, (w, rw), ds = run_and_resume(make, tmp_path, {'n_epochs': 2}, 'checkpoint_0001_000005.pt')
    assert batches[:12] != batches[12:]  # each epoch its own order
    assert resumed == batches[17:] and int(ds.fetched.sum()) == (12 - 5) * BS
    for a, b in zip(w, rw): torch.testing.assert_close(a, b, rtol=0, atol=0)

@pytest.mark.parametrize('kind', ['stateful', 'tensor'])
def test_a_loader_shorter_than_the_checkpoints_place_is_named_as_the_replay_names_it(tmp_path, kind):
    "The data shrank to 4 batches an epoch and the checkpoint had trained 5: the error the replay gives, not torchdata's bare `StopIteration` (stateful), nor the rest of the epoch skipped without a word (tensor)"
    def make(n=N):
        if kind == 'stateful': return stateful_loader(0)
        ds = Rows()
        return TensorLoader(ds.x[:n], ds.y[:n], bs=BS, shuffle=True), ds
    t, _, _ = trainer(make, CheckpointCB(tmp_path, every_n_epochs=None, every_n_batches=1, keep_last=None))
    t.fit(2, lr=0.1, valid=False)
    def short():
        if kind == 'tensor': return make(4 * BS)
        dl, ds = stateful_loader(0)
        return type(dl)(torch.utils.data.Subset(ds, range(4 * BS)), batch_size=BS, shuffle=True), ds
    r, _, _ = trainer(short)
    with pytest.raises(ValueError, match='The loader has 4 batches, but the checkpoint had trained 5 of this epoch: resume with the same data and batch size'):
        r.fit(2, lr=0.1, valid=False, resume_from=tmp_path/'checkpoint_0001_000005.pt')

def test_a_stateful_dataloader_resumed_with_another_number_of_workers_is_told_the_number(tmp_path):
    "torchdata cannot give a state to another number of workers (a bare `AssertionError` from inside it): the error names the number to build the loader with"
    t, _, _ = trainer(stateful_loader, CheckpointCB(tmp_path, every_n_epochs=None, every_n_batches=1, keep_last=None))
    t.fit(1, lr=0.1, valid=False)
    for workers in (0, 1):
        r, _, _ = trainer(lambda: stateful_loader(workers))
        with pytest.raises(ValueError, match=f'The loader state was saved with 2 workers, and this loader has {workers}: .* `num_workers=2` to resume'):
            r.fit(1, lr=0.1, valid=False, resume_from=tmp_path/'checkpoint_0000_000005.pt')

# ------------------------------------------------------------------------------------------------ issue 46: a Hugging Face iterable dataset
def hf_iterable(loader='plain', workers=0, buffer=8):
    "Rows through a Hugging Face iterable dataset of 4 shards (with a shuffle buffer of `buffer` rows: `None`, none), in torch's `DataLoader` or torchdata's"
    datasets = pytest.importorskip('datasets')
    if loader == 'stateful': pytest.importorskip('torchdata.stateful_dataloader')
    def make():
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(N, 4, generator=g), torch.randn(N, 1, generator=g)
        x[:, 0] = torch.arange(N) / N
        ds = datasets.Dataset.from_dict({'x': x.tolist(), 'y': y.tolist()}).to_iterable_dataset(num_shards=4)
        if buffer: ds = ds.shuffle(seed=0, buffer_size=buffer)
        ds = ds.with_format('torch')
        collate = lambda rows: (torch.stack([r['x'] for r in rows]), torch.stack([r['y'] for r in rows]))
        if loader == 'plain': return DataLoader(ds, batch_size=BS, collate_fn=collate, num_workers=workers), ds
        from torchdata.stateful_dataloader import StatefulDataLoader
        return StatefulDataLoader(ds, batch_size=BS, collate_fn=collate, num_workers=workers), ds
    return make

@pytest.mark.parametrize('loader, workers', [('plain', 0), ('plain', 2), ('stateful', 2)])
def test_an_hf_iterable_dataset_shuffles_each_epoch_anew(loader, workers):
    """Hugging Face's docs: call the dataset's `set_epoch` each epoch, or every epoch has the same order. It was never called (the
    loader's own and its samplers' `set_epoch` were, not its dataset's): 3 epochs of `shuffle(seed=0, buffer_size=8)` gave 3 times the
    same 12 batches; each epoch's order must be its own (and each epoch hold every row once)"""
    t, seen, ds = trainer(hf_iterable(loader, workers, 8))
    t.fit(3, lr=0.1, valid=False)
    epochs = [seen.batches[e:e + 12] for e in (0, 12, 24)]
    assert all(sorted(sum(e, [])) == list(range(N)) for e in epochs)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2] and epochs[0] != epochs[2]
    assert ds.epoch == 2  # the last epoch's

@pytest.mark.parametrize('loader, workers', [('plain', 0), ('stateful', 0), ('stateful', 2)])
@pytest.mark.parametrize('buffer', [8, None])
@pytest.mark.parametrize('ckpt, done', [('checkpoint_0001_000005.pt', 12 + 5), ('checkpoint_0002_000005.pt', 24 + 5)])
def test_an_hf_iterable_dataset_resumes_bit_for_bit_with_a_shuffle_buffer_and_in_the_epochs_after(tmp_path, loader, workers, buffer, ckpt, done):
    """Its `state_dict` leaves the shuffle buffer out: the resumed epoch gave 7 batches of other rows where the uninterrupted one has 7 (5 of
    its 96 rows never trained, others twice) and, with 2 workers, crashed inside `datasets` (IndexError); and the state it was given stayed
    with the dataset, so every later epoch started at the checkpoint's place too (5 batches lost an epoch, with or without a buffer)"""
    make = hf_iterable(loader, workers, buffer)
    t, seen, _ = trainer(make, CheckpointCB(tmp_path, every_n_epochs=None, every_n_batches=1, keep_last=None))
    t.fit(3, lr=0.1, valid=False)
    assert len(seen.batches) == 36 and all(sorted(sum(seen.batches[e:e + 12], [])) == list(range(N)) for e in (0, 12, 24))
    r, rseen, _ = trainer(make)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        r.fit(3, lr=0.1, valid=False, resume_from=tmp_path/ckpt)
    assert rseen.batches == seen.batches[done:]  # (in epoch 2 too: its own order, the dataset told its epoch on resuming)
    for a, b in zip(weights(t), weights(r)): torch.testing.assert_close(a, b, rtol=0, atol=0)
    notes = [str(w.message) for w in record if 'Resuming inside' in str(w.message)]
    if buffer: assert len(notes) == 1 and 'shuffles through a buffer' in notes[0] and 'replays 5 batches' in notes[0], notes
    elif not workers or loader == 'stateful': assert notes == []  # from its state, at once

def test_a_fault_of_datasets_loading_its_state_is_named_with_what_to_do(tmp_path, monkeypatch):
    "The shuffle buffer's state in 2 workers of a `StatefulDataLoader` (were it loaded): an IndexError from deep inside `datasets`, naming nothing"
    import aisaac.loaders
    make = hf_iterable('stateful', 2, 8)
    t, _, _ = trainer(make, CheckpointCB(tmp_path, every_n_epochs=None, every_n_batches=1, keep_last=None))
    t.fit(1, lr=0.1, valid=False)
    monkeypatch.setattr(aisaac.loaders, '_shuffle_buffer', lambda ds: False)  # as if the buffer were not seen: its state is loaded
    r, _, _ = trainer(make)
    with pytest.raises(RuntimeError, match=r"inside its epoch failed inside the `datasets` library.*IndexError: list index out of range, in a worker "
                                           r"process.*torch's `DataLoader`.*`num_workers=0`.*end of an epoch"):
        r.fit(1, lr=0.1, valid=False, resume_from=tmp_path/'checkpoint_0000_000005.pt')

@pytest.mark.parametrize('buffer', [8, None])
def test_an_hf_iterable_dataset_resumes_bit_for_bit_in_a_run_of_steps(tmp_path, buffer):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        batches, resumed, (w, rw), _ = run_and_resume(hf_iterable('plain', 0, buffer), tmp_path, {'steps': 34, 'valid_every': 17}, 'checkpoint_step_000017.pt')
    assert len(batches) == 34 and resumed == batches[17:]  # the rest of epoch 1 (from batch 5), and all of epoch 2
    for a, b in zip(w, rw): torch.testing.assert_close(a, b, rtol=0, atol=0)
