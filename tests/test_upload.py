"""Checkpoints uploaded to an fsspec URL (issue 40), on fsspec's local (`file://`) and in-memory (`memory://`) filesystems:
`CheckpointCB(upload=url)` copies each finished checkpoint there (after the write and the seal, from the background thread with
`background=True`) under a temporary name then its own, keeps `keep_last` there too and removes what a killed upload left;
`last_checkpoint(url)` downloads the newest whole one into a local cache, skipping a damaged newest one, and a run resumes from it
bit-identical. A sharded checkpoint's folder goes up and comes back whole. No remote store (S3, GCS, Azure) was tried."""
import errno, secrets, warnings
from pathlib import Path
import fsspec, fsspec.implementations.memory
import pytest
import torch
from aisaac.persist import CheckpointError, CheckpointWriteError
from aisaac.dcp import ShardedCheckpointEngine, folder_problem
from aisaac.callbacks.savers import CheckpointCB, checkpoints, last_checkpoint, remote_checkpoints, upload_checkpoint
from test_async_save import trainer as async_trainer, weights

def trainer(*cbs): return async_trainer(*cbs, rows=320)  # (10 batches an epoch)
def fit(t, **kw): t.fit(steps=20, valid_every=10, lr=1e-2, **kw)
def names(urls): return [u.rsplit('/', 1)[-1] for u in urls]

@pytest.fixture(params=['file', 'memory'])
def url(request, tmp_path):
    "A fresh folder URL on fsspec's local filesystem, or on its in-memory one"
    if request.param == 'file': return f'file://{tmp_path}/remote/run'
    return f'memory://aisaac-tests-{secrets.token_hex(4)}/run'

@pytest.fixture(scope='module')
def straight():
    t = trainer()
    fit(t)
    return weights(t)

@pytest.mark.parametrize('background', [False, True])
def test_each_checkpoint_goes_up_keep_last_applies_there_and_the_run_resumes_from_the_url(url, tmp_path, straight, background):
    t = trainer(CheckpointCB(tmp_path/'ckpt', every='4 steps', every_n_epochs=None, keep_last=2, background=background, upload=url))
    fit(t)
    assert names(remote_checkpoints(url)) == ['checkpoint_step_000016.pt', 'checkpoint_step_000020.pt']
    assert [p.name for p in checkpoints(tmp_path/'ckpt')] == names(remote_checkpoints(url))
    fs, root = fsspec.core.url_to_fs(url)
    assert sorted(names(fs.ls(root, detail=False))) == ['checkpoint_step_000016.pt', 'checkpoint_step_000020.pt']  # no temporary copy left
    got = last_checkpoint(url, cache=tmp_path/'cache')
    assert got == tmp_path/'cache'/'checkpoint_step_000020.pt' and got.read_bytes() == (tmp_path/'ckpt'/got.name).read_bytes()
    resumed = trainer()
    fit(resumed, resume_from=last_checkpoint(url, cache=tmp_path/'cache'))
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), straight))
    assert [p.name for p in checkpoints(tmp_path/'cache')] == ['checkpoint_step_000020.pt']  # the cache keeps the one returned

@pytest.mark.parametrize('damage', ['truncated', 'flipped'])
def test_last_checkpoint_of_a_url_skips_a_damaged_newest_upload_with_a_warning(url, tmp_path, straight, damage):
    fit(trainer(CheckpointCB(tmp_path/'ckpt', every='4 steps', every_n_epochs=None, keep_last=3, upload=url)))
    fs, _ = fsspec.core.url_to_fs(url)
    newest = remote_checkpoints(url)[-1]
    data = bytearray(fs.cat(newest))
    if damage == 'truncated': data = data[:len(data) // 2]
    else: data[len(data) // 3] ^= 1
    fs.pipe(newest, bytes(data))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        got = last_checkpoint(url, cache=tmp_path/'cache')
    assert got.name == 'checkpoint_step_000016.pt', got
    assert any('skipped 1 newer file' in str(x.message) and 'checkpoint_step_000020.pt' in str(x.message) for x in w), [str(x.message) for x in w]
    resumed = trainer()
    fit(resumed, resume_from=got)
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), straight))
    assert last_checkpoint(url, check=False, cache=tmp_path/'cache').name == 'checkpoint_step_000020.pt'  # (unchecked: the newest)

def test_a_url_with_nothing_uploaded_gives_none_and_one_with_nothing_whole_an_error(url, tmp_path):
    assert last_checkpoint(url, cache=tmp_path/'cache') is None
    fs, root = fsspec.core.url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    fs.pipe(f'{root}/checkpoint_step_000004.pt', b'not a checkpoint')
    fs.pipe(f'{root}/.checkpoint_step_000008.pt.123-0badc0de.tmp', b'an upload cut short')  # never a candidate
    with pytest.raises(CheckpointError, match='None of the 1 checkpoints in .* can be resumed from'): last_checkpoint(url, cache=tmp_path/'cache')

def test_the_next_upload_removes_what_a_killed_upload_left(url, tmp_path):
    fs, root = fsspec.core.url_to_fs(url)
    fs.makedirs(root, exist_ok=True)
    stale = f'{root}/.checkpoint_step_000004.pt.99999-0badc0de.tmp'
    fs.pipe(stale, b'half an upload')
    fit(trainer(CheckpointCB(tmp_path/'ckpt', every='4 steps', every_n_epochs=None, upload=url)))
    assert not fs.exists(stale) and names(remote_checkpoints(url))[-1] == 'checkpoint_step_000020.pt'

def test_an_upload_that_fails_in_the_background_is_raised_at_the_next_step(tmp_path, monkeypatch):
    "The store refuses the upload (a full remote disk): `CheckpointWriteError` names the upload and its cause; the local file is whole"
    url = f'memory://aisaac-tests-{secrets.token_hex(4)}/run'
    def refused(self, *args, **kwargs): raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(fsspec.implementations.memory.MemoryFileSystem, 'put', refused)
    t = trainer(CheckpointCB(tmp_path/'ckpt', every='4 steps', every_n_epochs=None, background=True, upload=url))
    with pytest.raises(CheckpointWriteError, match='Could not upload the checkpoint checkpoint_step_000004.pt to memory:.*No space left') as e: fit(t)
    assert isinstance(e.value.__cause__, OSError)
    assert [p.name for p in checkpoints(tmp_path/'ckpt')] == ['checkpoint_step_000004.pt']

@pytest.mark.parametrize('background', [False, True])
def test_an_upload_that_fails_says_so_where_to_and_that_the_local_checkpoint_is_whole(tmp_path, monkeypatch, background):
    "The store resets the connection: in either mode the fit ends with a `CheckpointWriteError` that names the upload, the URL, the cause and the whole local file"
    url = f'memory://aisaac-tests-{secrets.token_hex(4)}/run'
    def reset(self, *args, **kwargs): raise OSError(errno.ECONNRESET, 'Connection reset by peer')
    monkeypatch.setattr(fsspec.implementations.memory.MemoryFileSystem, 'put', reset)
    t = trainer(CheckpointCB(tmp_path/'ckpt', every='4 steps', every_n_epochs=None, background=background, upload=url))
    with pytest.raises(CheckpointWriteError) as e: fit(t)
    msg = str(e.value)
    assert msg.startswith(f'Could not upload the checkpoint checkpoint_step_000004.pt to {url}: ConnectionResetError') and 'Connection reset by peer' in msg
    assert f"The checkpoint was written whole here: {tmp_path/'ckpt'/'checkpoint_step_000004.pt'}" in msg
    assert isinstance(e.value.__cause__, OSError) and isinstance(e.value, OSError)  # (an `except OSError` still catches it)
    assert [p.name for p in checkpoints(tmp_path/'ckpt')] == ['checkpoint_step_000004.pt']
    assert ('in the background' in ' '.join(getattr(e.value, '__notes__', []))) == background

def test_a_url_fsspec_cannot_open_is_an_error_when_the_callback_is_made():
    with pytest.raises(ValueError, match='Protocol not known'): CheckpointCB(upload='nosuchstore://bucket/run')

def test_a_sharded_checkpoints_folder_goes_up_and_comes_back_whole(url, tmp_path):
    "On one process with a `ShardedCheckpointEngine`: the folder is uploaded under a temporary name, moved, listed and downloaded whole"
    t = trainer(CheckpointCB(tmp_path/'ckpt', every='10 steps', every_n_epochs=None, background=True, upload=url))
    t.checkpoint_engine = ShardedCheckpointEngine()
    fit(t)
    assert names(remote_checkpoints(url)) == ['checkpoint_step_000010', 'checkpoint_step_000020']
    got = last_checkpoint(url, cache=tmp_path/'cache')
    assert got.is_dir() and folder_problem(got) is None
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in (tmp_path/'ckpt'/got.name).iterdir())
    assert upload_checkpoint(got, url) == remote_checkpoints(url)[-1]  # again, over the one of the same name
