"""A corpus larger than memory: token shards written atomically and refused when a checksum fails, a language-model run from them
resumed exactly without reading again what it trained on, a streaming dataset accepted, the process's memory flat as the corpus
grows; and loaders at different places on 2 gloo processes, each resumed from its own state."""
import json, os, subprocess, sys, textwrap, types, warnings
from pathlib import Path
import numpy as np
import pytest
import torch
from torch import nn
import torch.nn.functional as F
from datasets import Dataset, DatasetDict, IterableDatasetDict
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.savers import CheckpointCB
import aisaac.shards as shards
from aisaac.shards import ShardError, ShardLoader, TokenShards, write_token_shards
from aisaac.text import text_dataloaders, tokenize_to_shards, train_tokenizer

torch.set_num_threads(1)
HERE = Path(__file__).parent
import torchrun_cases

def texts(n=400): return [f"fortune number {i}: {'many words ' * (i % 7)} and an end." for i in range(n)]

@pytest.fixture(scope='module')
def tok(): return train_tokenizer(texts(), vocab_size=300, cache=False)

def test_shards_are_written_atomically(tmp_path):
    "A write that fails half-way (here after its first shard is full) leaves no folder; the next one makes it whole"
    def failing():
        yield np.arange(150) % 100
        raise OSError('No space left on device')
    with pytest.raises(OSError, match='No space'): write_token_shards(failing(), tmp_path/'c', vocab_size=100, shard_tokens=100)
    assert list(tmp_path.iterdir()) == []  # no partial folder, no temporary one
    sh = write_token_shards([np.arange(250) % 100], tmp_path/'c', vocab_size=100, shard_tokens=100)
    assert sh.sizes == [100, 100, 50] and sh.read(95, 10).tolist() == list(range(95, 100)) + list(range(5))
    assert json.loads((tmp_path/'c'/'shards.json').read_text())['tokens'] == 250

def test_a_killed_write_leaves_no_folder(tmp_path):
    "SIGKILL in the middle of a write: the folder is not there, and a second write makes it"
    code = textwrap.dedent(f'''
        import sys, time, numpy as np
        from aisaac.shards import write_token_shards
        def slow():
            for i in range(100):
                yield np.arange(50)
                if i == 3: print('writing', flush=True); time.sleep(60)
        write_token_shards(slow(), {str(tmp_path/'c')!r}, vocab_size=100, shard_tokens=120)''')
    p = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == 'writing'
    p.kill(); p.wait()
    assert not (tmp_path/'c').exists()
    assert len(write_token_shards([np.arange(300) % 100], tmp_path/'c', vocab_size=100, shard_tokens=120)) == 300

def test_a_shard_whose_checksum_fails_is_refused_and_tokenized_again(tmp_path, tok):
    sh = tokenize_to_shards(texts(), tok, tmp_path, shard_tokens=1000)
    assert len(sh.files) > 2
    with open(sh.files[1], 'r+b') as f:
        f.seek(100); b = f.read(1); f.seek(100); f.write(bytes([b[0] ^ 1]))
    shards._verified.clear()
    with pytest.raises(ShardError, match=r'tokens_00001.bin is corrupt.*Delete the folder'): TokenShards(sh.path)
    with pytest.warns(UserWarning, match='Ignoring the token shards'): again = tokenize_to_shards(texts(), tok, tmp_path, shard_tokens=1000)
    assert again.path == sh.path and np.array_equal(again.read(0, len(again)), np.concatenate([np.fromfile(f, again.dtype) for f in again.files]))
    (sh.path/'tokens_00002.bin').unlink()
    with pytest.raises(ShardError, match='tokens_00002.bin is missing'): TokenShards(sh.path)

def test_a_streaming_dataset_is_tokenized_to_shards_and_trained_from(tmp_path, tok):
    dsd = DatasetDict(train=Dataset.from_dict({'text': texts()}), valid=Dataset.from_dict({'text': texts(40)}))
    stream = IterableDatasetDict({k: ds.to_iterable_dataset(num_shards=2) for k, ds in dsd.items()})
    with pytest.raises(ValueError, match='give `key=`'): text_dataloaders(stream, tok, block_size=16, bs=4)
    dls = text_dataloaders(stream, tok, block_size=16, bs=4, key='fortunes-v1', shards=tmp_path)
    whole = text_dataloaders(dsd, tok, block_size=16, bs=4, cache=False)
    assert type(dls.train).__name__ == 'ShardLoader'
    assert torch.equal(torch.cat([b['input_ids'] for b in dls.valid]), whole.valid.tensors[0][:, :-1])  # the same blocks as in memory

class Seen(Callback):
    def __init__(self): self.batches = []
    def after_dataloader(self, t):
        if t.model.training: self.batches.append(t.batch['input_ids'].clone())

def test_a_language_model_resumes_exactly_from_shards_without_reading_them_again(tmp_path, tok, monkeypatch):
    dsd = DatasetDict(train=Dataset.from_dict({'text': texts()}), valid=Dataset.from_dict({'text': texts(40)}))
    def trainer(*cbs):
        torch.manual_seed(0)
        dls = text_dataloaders(dsd, tok, block_size=16, bs=4, seed=1, shards=tmp_path/'shards')
        model = nn.Sequential(nn.Embedding(300, 8), nn.Dropout(0.1), nn.Linear(8, 300))
        seen = Seen()
        return Trainer(dls, lambda p, y: F.cross_entropy(p.flatten(0, 1), y.flatten()), torch.optim.AdamW, model,
                       callbacks=[BasicTrainCB(), seen, *cbs]), seen
    t, seen = trainer(CheckpointCB(tmp_path/'ckpt', every_n_epochs=None, every='5 steps', keep_last=None))
    n = len(t.dls.train)
    t.fit(steps=n + 20, valid_every=n // 2, lr=1e-2)
    reads = []
    monkeypatch.setattr(TokenShards, 'read', lambda self, start, k, read=TokenShards.read: reads.append(k) or read(self, start, k))
    r, rseen = trainer()
    with warnings.catch_warnings():
        warnings.filterwarnings('error', message='Resuming inside')
        r.fit(steps=n + 20, valid_every=n // 2, lr=1e-2, resume_from=tmp_path/'ckpt'/'checkpoint_step_000015.pt')
    assert len(rseen.batches) == n + 5 and all(torch.equal(a, b) for a, b in zip(rseen.batches, seen.batches[15:]))
    for a, b in zip(t.model.parameters(), r.model.parameters()): torch.testing.assert_close(a, b, rtol=0, atol=0)
    train_reads = len([k for k in reads if k == 17])  # a block of the training loader (the validation loader reads whole batches)
    assert train_reads == (n + 5) * 4  # the blocks of the batches left, and none of the 15 batches trained before

_MEMORY = '''
import resource, sys, numpy as np, torch
from aisaac.shards import ShardLoader, write_token_shards
torch.set_num_threads(1)
n, path = int(sys.argv[1]), sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sh = write_token_shards((np.random.default_rng(i).integers(0, 50_000, 1 << 20) for i in range(n >> 20)), path, vocab_size=50_000, shard_tokens=1 << 22)
seq = ShardLoader(sh, block_size=128, bs=32)
for b in seq: pass  # a whole epoch of consecutive windows
rnd = ShardLoader(sh, block_size=128, bs=32, shuffle=True, seed=0)
for i, b in zip(range(1000), rnd): pass  # random blocks from anywhere
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
'''

def test_the_memory_stays_flat_as_the_corpus_grows(tmp_path):
    "Writing and reading 4M and 64M tokens (8 and 128 MB on disk): the process's peak memory grows by the same few MB"
    def grown(n):
        r = subprocess.run([sys.executable, '-c', _MEMORY, str(n), str(tmp_path/f'c{n}')], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return int(r.stdout.split()[-1]) / 1024  # MiB (ru_maxrss is in KiB)
    small, large = grown(4 << 20), grown(64 << 20)
    assert large < small + 8, (small, large)  # in memory, as int64, the large corpus alone would be 512 MiB more

TORCHRUN_CASES = HERE/'stateful_run.py', {c: [c] for c in ('stream', 'shards')}

@pytest.fixture(scope='module')
def cases(request):
    "Each process's result of a case of tests/stateful_run.py: those the selected tests use run in one torchrun launch (`torchrun_cases.Cases`)"
    return torchrun_cases.Cases(request, *TORCHRUN_CASES)

@pytest.mark.parametrize('case', ['stream', 'shards'])
@torchrun_cases.uses('stream', 'shards')
def test_on_2_processes_each_loader_resumes_from_its_own_state(cases, case):
    results = cases(case)
    for r in results:
        assert r['resumed'] == r['whole'][(15 if case == 'shards' else 12) + 3:]
        assert r['rweights'] == r['weights']
    if case == 'stream':
        assert results[0]['whole'][0][0] == 0 and results[1]['whole'][0][0] == 1000  # each process its own rows
        assert [r['read'] for r in results] == [48 - 3 * 4] * 2  # from its own place: none of the rows trained before

@pytest.mark.parametrize('world', [2, 3])
@pytest.mark.parametrize('bs', [1, 4, 32])
def test_consecutive_windows_on_several_processes_give_every_block_once_in_as_many_batches(tmp_path, world, bs):
    "A validation pass on `world` processes: every block exactly once (before: 96 of 100 blocks on 2 processes, the last ones dropped), the same number of batches on each process (a sharded model's forward is collective), none empty, at most `bs` blocks (2 when `bs` is 1)"
    write_token_shards([np.arange(103 * 10)], tmp_path/'c', vocab_size=2000, shard_tokens=300)  # 103 blocks of 10 ids, each starting at its own id
    sh = TokenShards(tmp_path/'c')
    loaders = [ShardLoader(sh, block_size=9, bs=bs, rank=r, world=world) for r in range(world)]
    batches = [[b[0] for b in dl] for dl in loaders]
    starts = sorted(int(x) for bs_ in batches for b in bs_ for x in b[:, 0])
    assert starts == list(range(0, 1030, 10))
    assert len({len(b) for b in batches}) == 1 and len(batches[0]) == len(loaders[0])
    assert all(0 < len(b) <= max(bs, 2) for bs_ in batches for b in bs_)

# ---------------------------------------------------------------- nanoGPT's raw .bin files: np.uint16 ids, no manifest
def nanogpt_bin(path, n=3000, vocab=65, seed=0, dtype=np.uint16):
    "A token file as nanoGPT's prepare.py writes one: `np.array(ids, dtype=np.uint16).tofile(path)`"
    ids = np.random.default_rng(seed).integers(0, vocab, n)
    np.array(ids, dtype=dtype).tofile(path)
    return ids

def test_a_raw_token_file_is_read_as_nanogpts_get_batch_reads_it(tmp_path):
    "TokenFile('train.bin'): random windows of block_size + 1 ids, drawn as nanoGPT's get_batch draws them (its formula, with the loader's generator)"
    from aisaac.shards import TokenFile, next_tokens
    ids = nanogpt_bin(tmp_path/'train.bin')
    tf = TokenFile(tmp_path/'train.bin', vocab_size=65)
    assert len(tf) == 3000 and tf.dtype == np.uint16 and tf.read(10, 5).tolist() == ids[10:15].tolist()
    dl = ShardLoader(tf, block_size=32, bs=4, shuffle=True, seed=1337, tfm=next_tokens)
    g, data = torch.Generator().manual_seed(1337), np.memmap(tmp_path/'train.bin', dtype=np.uint16, mode='r')
    for (x, y), _ in zip(dl, range(5)):  # nanoGPT's get_batch, with a generator of its own
        ix = torch.randint(len(data) - 32, (4,), generator=g)
        assert torch.equal(x, torch.stack([torch.from_numpy(data[i:i+32].astype(np.int64)) for i in ix]))
        assert x.is_contiguous() and y.is_contiguous()  # (nanoGPT's model calls targets.view(-1))
        assert torch.equal(y, torch.stack([torch.from_numpy(data[i+1:i+1+32].astype(np.int64)) for i in ix]))
    halves = [ShardLoader(TokenFile(tmp_path/'train.bin'), block_size=32, bs=2, shuffle=True, seed=1337, rank=r, world=2) for r in (0, 1)]
    whole = ShardLoader(tf, block_size=32, bs=4, shuffle=True, seed=1337)  # two processes: each its half of every batch
    assert torch.equal(torch.cat([next(iter(h))[0] for h in halves]), next(iter(whole))[0])
    import pickle; assert pickle.loads(pickle.dumps(tf)).read(10, 5).tolist() == ids[10:15].tolist()  # (to a worker or another process)

def test_a_raw_token_file_that_does_not_fit_is_refused_with_the_fix(tmp_path):
    from aisaac.shards import TokenFile
    (tmp_path/'odd.bin').write_bytes(b'\x01\x00\x02\x00\x03')
    with pytest.raises(ValueError, match=r"5 bytes, not a whole number of uint16 ids \(2 bytes each\)"): TokenFile(tmp_path/'odd.bin')
    nanogpt_bin(tmp_path/'train.bin')
    with pytest.raises(ValueError, match=r"vocabulary of 100,277 tokens.*uint16.*65,535.*dtype=np.uint32"): TokenFile(tmp_path/'train.bin', vocab_size=100_277)
    with pytest.raises(TypeError, match="an integer dtype"): TokenFile(tmp_path/'train.bin', dtype=np.float32)
    with pytest.raises(FileNotFoundError, match="no token file"): TokenFile(tmp_path/'val.bin')
    with pytest.raises(ValueError, match=r"`batches` .*random blocks"): ShardLoader(TokenFile(tmp_path/'train.bin'), block_size=8, bs=2, batches=3)

def test_an_evaluation_loader_draws_its_batches_afresh_at_each_pass(tmp_path):
    "batches=3: each pass is 3 new random batches (nanoGPT's eval_iters), from where the generator is"
    from aisaac.shards import TokenFile
    nanogpt_bin(tmp_path/'val.bin')
    dl = ShardLoader(TokenFile(tmp_path/'val.bin'), block_size=16, bs=2, shuffle=True, seed=0, batches=3)
    first, second = [b[0] for b in dl], [b[0] for b in dl]
    assert len(dl) == len(first) == len(second) == 3 and not torch.equal(torch.stack(first), torch.stack(second))

@pytest.mark.parametrize('every', ['7 steps', '10 steps'])
def test_a_run_from_raw_token_files_resumes_exactly(tmp_path, every):
    "Training and validation from nanoGPT's .bin files, a checkpoint inside a pass (step 7) or at a validation (10): the resumed run is the straight one's, bit for bit"
    from aisaac.shards import TokenFile, next_tokens
    from aisaac.data import DataLoaders
    nanogpt_bin(tmp_path/'train.bin'); nanogpt_bin(tmp_path/'val.bin', n=800, seed=1)
    def run(d, resume=None):
        torch.manual_seed(0)
        dls = DataLoaders(ShardLoader(TokenFile(tmp_path/'train.bin', vocab_size=65), block_size=16, bs=4, shuffle=True, seed=1337, tfm=next_tokens),
                          ShardLoader(TokenFile(tmp_path/'val.bin', vocab_size=65), block_size=16, bs=4, shuffle=True, seed=1, batches=2, tfm=next_tokens))
        model = nn.Sequential(nn.Embedding(65, 16), nn.Dropout(0.1), nn.Linear(16, 65))
        t = Trainer(dls, lambda p, y: F.cross_entropy(p.flatten(0, 1), y.flatten()), torch.optim.AdamW, model,
                    callbacks=[BasicTrainCB(), CheckpointCB(d, every_n_epochs=None, every=every, keep_last=None)])
        from aisaac.callbacks.metrics import MetricsCB
        t.add_callbacks(MetricsCB(show=False))
        t.fit(steps=25, valid_every=5, lr=1e-2, resume_from=resume)
        return t
    a = run(tmp_path/'a')
    ckpt = sorted((tmp_path/'a').glob('*.pt'))[0]
    b = run(tmp_path/'b', ckpt)
    for p, q in zip(a.model.parameters(), b.model.parameters()): assert torch.equal(p, q)
    assert a.history.get_metric_values('valid_loss') == b.history.get_metric_values('valid_loss')
