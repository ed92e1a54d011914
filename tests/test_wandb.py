"WandBLogger: an offline run read back from its own files (values, config, images, text tables), the mode chosen without a login, a resumed run going on with the same W&B run."
import json, sys
from pathlib import Path
import pytest, torch
from torch import nn

pytest.importorskip('wandb')
from aisaac.callbacks.trackers import WandBLogger, read_wandb_file, read_wandb_run, _wandb_mode
from aisaac.callbacks.samples import SampleCB
from aisaac.models import GPT
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from test_loggers import fit as fit_cls, LogBatches, Img, FailAt, HIST
from test_crash import trainer, fit, Crash

@pytest.fixture(autouse=True)
def no_login(monkeypatch, tmp_path):
    "No key, no mode, no netrc: as on a machine where nobody ran `wandb login`"
    for k in ('WANDB_MODE', 'WANDB_API_KEY', 'WANDB_BASE_URL', 'WANDB_DIR'): monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv('NETRC', str(tmp_path/'no-netrc'))
    monkeypatch.setenv('WANDB_SILENT', 'true')

def table(lg, row):
    "The rows of the table a history row points to, from the JSON file wandb wrote"
    return json.loads((lg.run_dir/'files'/row['path']).read_text())

def test_an_offline_run_holds_the_values_config_image_and_text(tmp_path):
    lg = WandBLogger(dir=tmp_path/'wb', config={'batch_size': 32})
    t = fit_cls(lg, LogBatches(), Img())
    assert lg.run is None and lg.run_dir.parent == tmp_path/'wb'/'wandb' and lg.run_dir.name.startswith('offline-run-')
    run = read_wandb_run(lg.run_dir)
    assert run['id'] == lg.run_id
    assert (run['config']['lr'], run['config']['n_params'], run['config']['opt_func'], run['config']['batch_size']) == (0.05, 10, 'Adam', 32)
    h = run['history']
    for name in HIST:
        rows = [r for r in h if name in r]
        assert [r['epoch'] for r in rows] == [0, 1, 2] and [r[name] for r in rows] == t.history.get_metric_values(name)
    batches = [r for r in h if 'batch/seen' in r]
    assert [r['batch/seen'] for r in batches] == [float(i) for i in range(12)] and [r['batch/step'] for r in batches] == list(range(12))
    (img,) = [r for r in h if 'grid' in r]
    assert img['epoch'] == 2 and img['grid']['_type'] == 'image-file' and (img['grid']['width'], img['grid']['height']) == (10, 8)
    assert (lg.run_dir/'files'/img['grid']['path']).exists()
    (txt,) = [r for r in h if 'sample' in r]
    assert table(lg, txt['sample']) == {'columns': ['step', 'text'], 'data': [[7, 'Once upon a time']]}
    exits = [r.exit for r in read_wandb_file(next(lg.run_dir.glob('*.wandb'))) if r.WhichOneof('record_type') == 'exit']
    assert [e.exit_code for e in exits] == [0]

def test_a_failed_fit_finishes_its_run_failed(tmp_path):
    lg = WandBLogger(dir=tmp_path)
    with pytest.raises(RuntimeError): fit_cls(lg, FailAt(1))
    assert lg.run is None
    recs = read_wandb_file(next(lg.run_dir.glob('*.wandb')))
    assert [r.exit.exit_code for r in recs if r.WhichOneof('record_type') == 'exit'] == [1]
    assert [r['epoch'] for r in read_wandb_run(lg.run_dir)['history'] if 'valid_loss' in r] == [0]

def test_offline_unless_a_mode_a_key_or_a_login_says_otherwise(tmp_path, monkeypatch):
    assert _wandb_mode(None) == 'offline'
    assert _wandb_mode('disabled') == 'disabled'
    (tmp_path/'netrc').write_text('machine api.wandb.ai\n  login user\n  password ' + 'k' * 40 + '\n')
    monkeypatch.setenv('NETRC', str(tmp_path/'netrc'))
    assert _wandb_mode(None) is None  # logged in: wandb's own choice (online)
    monkeypatch.setenv('WANDB_BASE_URL', 'https://wandb.example.com')  # logged in elsewhere, not on this server
    assert _wandb_mode(None) == 'offline'
    monkeypatch.setenv('WANDB_API_KEY', 'k' * 40)
    assert _wandb_mode(None) is None
    monkeypatch.delenv('WANDB_API_KEY'); monkeypatch.setenv('WANDB_MODE', 'online')
    assert _wandb_mode(None) is None

def test_a_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, 'wandb', None)
    with pytest.raises(ImportError, match=r'WandBLogger needs the `wandb` package: pip install "aisaac\[wandb\]"'): WandBLogger()

def test_a_given_id_is_the_runs_and_resume_is_refused(tmp_path):
    lg = WandBLogger(dir=tmp_path, id='myrun01')
    fit_cls(lg, n_epochs=1)
    assert lg.run_id == 'myrun01' and read_wandb_run(lg.run_dir)['id'] == 'myrun01'
    with pytest.raises(ValueError, match='give `id=` to go on with a given run'): WandBLogger(resume='must')

def test_a_file_cut_short_by_a_kill_reads_up_to_its_last_whole_record(tmp_path):
    lg = WandBLogger(dir=tmp_path)
    fit_cls(lg, LogBatches(), n_epochs=1)
    f = next(lg.run_dir.glob('*.wandb'))
    whole, data = read_wandb_file(f), f.read_bytes()
    assert len(whole) > 20 and whole[-1].WhichOneof('record_type') == 'exit'
    for cut in (7, 100, len(data) // 2, len(data) - 3):
        (tmp_path/'cut.wandb').write_bytes(data[:cut])
        got = read_wandb_file(tmp_path/'cut.wandb')
        assert got == whole[:len(got)] and len(got) < len(whole)

def test_a_run_of_many_blocks_reads_back_whole(tmp_path):
    "The file is written in 32 KiB blocks, a record split across them: every value comes back"
    import wandb
    run = wandb.init(project='t', dir=tmp_path, mode='offline', settings=wandb.Settings(reinit='create_new'))
    for i in range(2000): run.log({'i': i, 'text': 'x' * (i % 97) * 5})  # records of many sizes, some over a block's remainder
    d = Path(run.dir).parent; run.finish()
    from aisaac.callbacks.trackers import _wait_written
    _wait_written(next(d.glob('*.wandb')))
    assert next(d.glob('*.wandb')).stat().st_size > 4 * 32768
    h = read_wandb_run(d)['history']
    assert [r['i'] for r in h] == list(range(2000)) and all(r['text'] == 'x' * (r['i'] % 97) * 5 for r in h)

def test_not_a_wandb_file(tmp_path):
    (tmp_path/'nothing').mkdir()
    (tmp_path/'x.wandb').write_bytes(b'hello')
    with pytest.raises(ValueError, match='not a W&B transaction log'): read_wandb_file(tmp_path/'x.wandb')
    with pytest.raises(FileNotFoundError, match="holds no `run-<id>.wandb` file"): read_wandb_run(tmp_path/'nothing')

def values(*dirs):
    "{tag: [(step, value)]} of the numbers in the history of the runs' folders, in the order logged"
    out = {}
    for d in dirs:
        for row in read_wandb_run(d)['history']:
            axis = next(a for a in ('epoch', 'step', 'batch/step') if a in row)
            for k, v in row.items():
                if k != axis and not k.startswith('_'): out.setdefault(k, []).append((row[axis], v))
    return out

def test_a_resumed_fit_goes_on_with_the_same_run_and_logs_no_value_twice(tmp_path):
    "Crash at step 43: the checkpoint of step 40 was taken before its validation logged; a new process's logger resumes from "
    "it: the same run id, a second offline folder, and the two folders together hold each value of the uninterrupted run once"
    ref = WandBLogger(dir=tmp_path/'ref')
    fit(trainer(tmp_path/'ref', ref), tmp_path/'ref')
    lg = WandBLogger(dir=tmp_path/'wb', config={'what': 'first'})
    with pytest.raises(RuntimeError): fit(trainer(tmp_path, lg, Crash(43)), tmp_path)
    first = lg.run_dir
    lg2 = WandBLogger(dir=tmp_path/'wb', config={'what': 'resumed'})  # a new process
    fit(trainer(tmp_path, lg2), tmp_path, resume=True)
    assert lg2.run_id == lg.run_id and lg2.run_dir != first and lg.run_id in lg2.run_dir.name  # offline-run-<time>-<id>, '-1' added in the same second
    assert read_wandb_run(lg2.run_dir)['config']['what'] == 'resumed'
    got, want = values(first, lg2.run_dir), values(ref.run_dir)
    assert got == want and [s for s, _ in want['valid_loss']] == [20, 40, 60], (got, want)
    assert len(values(first)['valid_loss']) == 2  # step 20's and 40's: the resumed run did not log 40 again

def test_a_step_runs_values_go_against_the_step_axis(tmp_path):
    "A run measured in steps has intervals, not epochs: their values go against W&B's `step` axis (they went against `epoch`, holding steps)"
    lg = WandBLogger(dir=tmp_path/'wb')
    fit(trainer(tmp_path, lg), tmp_path)
    rows = [r for r in read_wandb_run(lg.run_dir)['history'] if 'valid_loss' in r]
    assert [r.get('step') for r in rows] == [20, 40, 60] and not any('epoch' in r for r in rows)

def test_the_same_logger_resumes_its_run(tmp_path):
    "A notebook's crash: the fit is resumed with the same callbacks, whose logger already had the run"
    lg = WandBLogger(dir=tmp_path/'wb')
    with pytest.raises(RuntimeError): fit(trainer(tmp_path, lg, Crash(43)), tmp_path)
    first, run_id = lg.run_dir, lg.run_id
    fit(trainer(tmp_path, lg), tmp_path, resume=True)
    assert lg.run_id == run_id and lg.run_dir != first
    assert [s for s, _ in values(first, lg.run_dir)['valid_loss']] == [20, 40, 60]

class Chars:
    "A character tokenizer"
    def encode(self, text): return [ord(c) % 64 for c in text]
    def decode(self, ids): return ''.join(chr(65 + i % 26) for i in ids)

def test_samples_of_samplecb_become_a_table_that_survives_a_resume(tmp_path):
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (64, 9))
    dls = type('D', (), {'train': [(ids[i:i+8, :-1], ids[i:i+8, 1:]) for i in range(0, 64, 8)], 'valid': [(ids[:8, :-1], ids[:8, 1:])]})()
    def make(lg): return Trainer(dls, lambda out, y: nn.functional.cross_entropy(out.flatten(0, 1), y.flatten()), torch.optim.AdamW,
                                 GPT(64, n_layer=1, n_head=2, d_model=16, block_size=16),
                                 callbacks=[BasicTrainCB(), sm := SampleCB('abc', Chars(), every='3 steps', max_new_tokens=4), lg]), sm
    lg = WandBLogger(dir=tmp_path)
    t, sm = make(lg); t.fit(1, lr=1e-2)
    rows = [r['sample'] for r in read_wandb_run(lg.run_dir)['history'] if 'sample' in r]
    assert len(rows) == 3  # steps 3, 6 and 8 (the end)
    assert table(lg, rows[-1])['data'] == [[s, 'abc' + text] for s, text in sm.samples] and [s for s, _ in sm.samples] == [3, 6, 8]
    assert lg.state_dict()['tables'] == {'sample': [[s, 'abc' + text] for s, text in sm.samples]}
    lg2 = WandBLogger(dir=tmp_path)
    lg2.load_state_dict(lg.state_dict())  # (not in a fit: the tables and steps are taken, no run is started)
    assert lg2.tables == lg.tables and lg2.run is None
