"Loggers: what they write (read back with csv, json, TensorBoard's reader and MLflow's client), flushing, failures."
import csv, json, math, sys, warnings
from types import SimpleNamespace
import pytest, torch
from torch import nn
import torcheval.metrics as tem
from aisaac.trainer import Trainer
from aisaac.core.callback import Callback
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.loggers import Logger, ConsoleLogger, CSVLogger, JSONLinesLogger, run_config
from aisaac.callbacks.trackers import TensorBoardLogger, MLflowLogger, _image_array

def cls_dls(n=192, bs=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g); y = (x[:, 0] - x[:, 2] > 0).long()
    batches = [(x[i:i+bs], y[i:i+bs]) for i in range(0, n, bs)]
    return SimpleNamespace(train=batches[:4], valid=batches[4:])

def fit(*cbs, n_epochs=3, **kw):
    torch.manual_seed(0)
    t = Trainer(cls_dls(), nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(4, 2),
                callbacks=[BasicTrainCB(), MetricsCB(acc=tem.MulticlassAccuracy()), *cbs])
    t.fit(n_epochs, lr=0.05, **kw)
    return t

class LogBatches(Callback):
    "Logs a per-batch value: the batch's number in the fit"
    def before_fit(self, t): self.n = 0
    def after_batch(self, t):
        if t.training: t.log({'seen': float(self.n)}, per='batch'); self.n += 1

class FailAt(Callback):
    "Raises at the start of epoch `epoch`"
    def __init__(self, epoch): self.epoch = epoch
    def before_epoch(self, t):
        if t.epoch == self.epoch: raise RuntimeError('boom')

class ReadEachEpoch(Callback):
    "After each epoch (both passes done), reads the log file with `read`: it must already hold that epoch"
    order = 30
    def __init__(self, read): self.read, self.seen = read, []
    def checkpoint(self, t, at):
        if at == 'epoch': self.seen.append(self.read())

HIST = ('train_loss', 'valid_loss', 'acc')

# ---------------------------------------------------------------- console, CSV, JSON lines
def test_console_logger_prints_a_line_per_epoch(capsys):
    t = fit(ConsoleLogger())
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].startswith('epoch 0: train_loss ')
    assert f"acc {t.history.get_metric_values('acc')[2]:.6g}" in lines[2]

def test_csv_has_one_row_per_epoch_with_the_numbers_of_the_history(tmp_path):
    t = fit(CSVLogger(tmp_path/'sub'/'m.csv'), LogBatches())
    rows = list(csv.DictReader(open(tmp_path/'sub'/'m.csv')))
    assert list(rows[0]) == ['epoch', *HIST] and [int(r['epoch']) for r in rows] == [0, 1, 2]
    for name in HIST: assert [float(r[name]) for r in rows] == t.history.get_metric_values(name)  # exact: numbers in full

def test_csv_per_batch_and_new_columns(tmp_path):
    class Late(Callback):
        def after_epoch(self, t):
            if not t.training and t.epoch == 1: t.log({'extra': 7.5}, step=1)
    t = fit(CSVLogger(tmp_path/'b.csv', per='batch'), CSVLogger(tmp_path/'e.csv'), LogBatches(), Late())
    rows = list(csv.DictReader(open(tmp_path/'b.csv')))
    assert [float(r['seen']) for r in rows] == list(range(12)) and list(rows[0]) == ['batch', 'seen']
    rows = list(csv.DictReader(open(tmp_path/'e.csv')))
    assert [r['extra'] for r in rows] == ['', '7.5', '']
    with pytest.raises(ValueError, match="two loggers"): CSVLogger(tmp_path/'x.csv', per='all')

def test_csv_appends_new_rows_and_rewrites_only_when_a_row_or_the_columns_change(tmp_path, monkeypatch):
    "A per-batch CSV grows by appending (a long run does not rewrite every row at every epoch); the file always equals a full rewrite"
    import aisaac.callbacks.loggers as lg
    replaced = []
    monkeypatch.setattr(lg.os, 'replace', lambda a, b: (replaced.append(b), __import__('os').rename(a, b)))
    log = CSVLogger(tmp_path/'b.csv', per='batch')
    t = fit(log, LogBatches(), n_epochs=4)
    assert replaced == [tmp_path/'b.csv'] * 2  # the empty file at the start, the header and rows of the first pass; then appends
    rows = list(csv.DictReader(open(tmp_path/'b.csv')))
    assert [float(r['seen']) for r in rows] == list(range(16)) and list(rows[0]) == ['batch', 'seen']
    t.fit(1)  # a second fit appends too, its rows after the first's
    assert [float(r['seen']) for r in csv.DictReader(open(tmp_path/'b.csv'))] == list(range(16)) + list(range(4))
    log.rows[3]['seen'] = -1.0; log._new.add(3); log._dirty = True; log.flush()  # an earlier row changed: a whole rewrite
    assert [float(r['seen']) for r in csv.DictReader(open(tmp_path/'b.csv'))][3] == -1.0 and len(replaced) == 3

def test_jsonl_writes_a_line_per_log_call_per_epoch_and_batch(tmp_path):
    lg = JSONLinesLogger(tmp_path/'log.jsonl')
    t = fit(lg, LogBatches())
    lines = [json.loads(l) for l in open(tmp_path/'log.jsonl')]
    epochs = [l for l in lines if l['per'] == 'epoch']
    assert [l['step'] for l in epochs] == [0, 1, 2]
    for name in HIST: assert [l[name] for l in epochs] == t.history.get_metric_values(name)
    assert [l['seen'] for l in lines if l['per'] == 'batch'] == list(range(12))
    t.fit(1)  # the same logger in a second fit appends
    again = [json.loads(l) for l in open(tmp_path/'log.jsonl')]
    assert again[:len(lines)] == lines and len(again) == len(lines) + 1 + 4
    assert [l['step'] for l in again if l['per'] == 'epoch'] == [0, 1, 2, 3]

def test_jsonl_writes_nan_as_null(tmp_path):
    lg = JSONLinesLogger(tmp_path/'n.jsonl')
    t = fit(lg, n_epochs=1)
    t.fit(1, callbacks=[])
    t.log({'loss': float('nan'), 'name': 'x'}, step=9)  # outside a fit: the logger's file is closed, nothing written
    lg.before_fit(t); t.log({'loss': float('nan')}, step=9); lg.cleanup_fit(t)
    assert json.loads(open(tmp_path/'n.jsonl').readlines()[-1]) == {'per': 'epoch', 'step': 9, 'loss': None}

@pytest.mark.parametrize('make', [lambda p: CSVLogger(p/'m.csv'), lambda p: JSONLinesLogger(p/'m.jsonl')])
def test_files_are_flushed_each_epoch_and_a_crashed_run_keeps_its_log(tmp_path, make):
    lg = make(tmp_path)
    count = lambda: sum(1 for l in open(lg.path) if l.strip()) - isinstance(lg, CSVLogger)  # rows (CSV: less its header)
    probe = ReadEachEpoch(count)
    with pytest.raises(RuntimeError, match='boom'): fit(lg, probe, FailAt(2))
    assert probe.seen == [1, 2] and count() == 2

class Weights(Callback):
    "Keeps a copy of the weights before the fit and counts the training batches"
    order = -100
    def before_fit(self, t): self.before, self.batches = t.model.weight.detach().clone(), 0
    def after_batch(self, t): self.batches += t.training

def test_a_logger_that_cannot_start_stops_the_fit_before_the_first_batch(tmp_path):
    "Its error is raised from `before_fit`, whatever its on_error: no batch ran, the weights are as they were"
    (tmp_path/'file').write_text('')
    w = Weights()
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no warn-and-go-on
        with pytest.raises(FileExistsError) as e: fit(CSVLogger(tmp_path/'file'/'m.csv'), w)
    assert any('CSVLogger.before_fit' in n for n in e.value.__notes__)
    assert w.batches == 0

def test_mlflow_refusing_its_tracking_uri_stops_the_fit_at_set_up(tmp_path, monkeypatch):
    "MLflow 3 refuses a file: store; the run must not train unlogged"
    pytest.importorskip('mlflow')
    monkeypatch.delenv('MLFLOW_ALLOW_FILE_STORE', raising=False)
    w = Weights()
    with pytest.raises(Exception, match='filesystem tracking backend') as e:
        fit(MLflowLogger(tracking_uri=f'file://{tmp_path}/mlruns'), w)
    assert any('MLflowLogger.before_fit' in n for n in e.value.__notes__)
    assert w.batches == 0

def test_a_logger_that_fails_later_warns_and_the_fit_completes(tmp_path):
    class Breaks(Callback):  # the log file goes away in the middle of the run
        order = 30
        def after_epoch(self, t):
            if t.epoch == 1 and t.training: t.JSONLinesLogger.file.close()  # (before epoch 1's row, which MetricsCB logs in the validation pass's after_epoch)
    with pytest.warns(UserWarning, match="JSONLinesLogger"):
        t = fit(JSONLinesLogger(tmp_path/'j.jsonl'), Breaks())
    assert len(t.history.get_metric_values('valid_loss')) == 3
    assert len(open(tmp_path/'j.jsonl').readlines()) == 1  # epoch 0, flushed before the file broke

def test_a_logger_must_write_log(tmp_path):
    class Nothing(Logger): pass
    with pytest.warns(UserWarning, match="must define `write"): fit(Nothing())

def test_text_goes_to_the_console_the_jsonl_file_and_the_progress_display(tmp_path, capsys):
    from aisaac.callbacks.progress import ProgressCB, PrintProgressCB
    fit(ConsoleLogger(), JSONLinesLogger(tmp_path/'log.jsonl'), PrintProgressCB(), Img(), n_epochs=1)
    out = capsys.readouterr().out
    assert 'sample 7: Once upon a time' in out and 'sample (step 7): Once upon a time' in out
    lines = [json.loads(l) for l in open(tmp_path/'log.jsonl')]
    assert {'per': 'text', 'step': 7, 'name': 'sample', 'text': 'Once upon a time'} in lines
    fit(ProgressCB(bars=False), Img(), n_epochs=1)
    assert capsys.readouterr().out.rstrip().endswith('sample (step 7): Once upon a time')
    with pytest.raises(TypeError, match='must be a string'): fit(type('T', (Callback,), {'after_fit': lambda s, t: t.log_text('x', 3)})())

# ---------------------------------------------------------------- TensorBoard
class Img(Callback):
    "Logs an image at the end of the fit"
    def after_fit(self, t):
        t.log_image('grid', torch.rand(3, 8, 10), step=2)
        t.log_text('sample', 'Once upon a time', step=7)

def test_tensorboard_event_files_read_back_with_the_same_values(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    t = fit(TensorBoardLogger(tmp_path/'tb'), LogBatches(), Img())
    ea = EventAccumulator(str(tmp_path/'tb'), size_guidance={'scalars': 0, 'images': 0}); ea.Reload()
    assert sorted(ea.Tags()['scalars']) == sorted([*HIST, 'batch/seen'])
    for name in HIST:
        ev = ea.Scalars(name)
        assert [e.step for e in ev] == [0, 1, 2]
        assert [e.value for e in ev] == pytest.approx(t.history.get_metric_values(name), rel=1e-6)  # stored as float32
    assert [e.value for e in ea.Scalars('batch/seen')] == list(range(12))
    img = ea.Images('grid')
    assert len(img) == 1 and (img[0].step, img[0].width, img[0].height) == (2, 10, 8)
    txt = [tag for tag in ea.Tags()['tensors'] if tag.startswith('sample')]
    assert len(txt) == 1
    (ev,) = ea.Tensors(txt[0])
    assert ev.step == 7 and ev.tensor_proto.string_val == [b'Once upon a time']

# ---------------------------------------------------------------- MLflow
def test_mlflow_run_reads_back_with_the_same_values(tmp_path, monkeypatch):
    pytest.importorskip('mlflow')
    from mlflow.tracking import MlflowClient
    monkeypatch.delenv('MLFLOW_TRACKING_URI', raising=False)
    assert MLflowLogger().tracking_uri == 'sqlite:///mlruns.db'
    monkeypatch.setenv('MLFLOW_TRACKING_URI', f'sqlite:///{tmp_path}/mlruns.db')
    lg = MLflowLogger(experiment='test')
    assert lg.tracking_uri == f'sqlite:///{tmp_path}/mlruns.db'
    monkeypatch.chdir(tmp_path)  # the images go to the experiment's artifact folder, by default ./mlruns
    t = fit(lg, LogBatches(), Img())
    c = MlflowClient(lg.tracking_uri)
    for name in HIST:
        h = c.get_metric_history(lg.run_id, name)
        assert [m.step for m in h] == [0, 1, 2] and [m.value for m in h] == t.history.get_metric_values(name)
    assert [m.value for m in c.get_metric_history(lg.run_id, 'batch/seen')] == list(range(12))
    run = c.get_run(lg.run_id)
    assert run.info.status == 'FINISHED' and run.data.params['lr'] == '0.05' and run.data.params['n_params'] == '10'
    assert c.get_experiment(run.info.experiment_id).name == 'test'
    assert any('grid' in f.path for f in c.list_artifacts(lg.run_id, 'images'))
    assert [f.path for f in c.list_artifacts(lg.run_id, 'text')] == ['text/sample_7.txt']
    assert open(c.download_artifacts(lg.run_id, 'text/sample_7.txt', str(tmp_path))).read() == 'Once upon a time'
    lg2 = MLflowLogger(lg.tracking_uri, experiment='test')
    with pytest.raises(RuntimeError): fit(lg2, FailAt(1))
    run2 = c.get_run(lg2.run_id)
    assert run2.info.status == 'FAILED' and len(c.get_metric_history(lg2.run_id, 'valid_loss')) == 1

# ---------------------------------------------------------------- optional packages, images
@pytest.mark.parametrize('cls,module,extra', [(TensorBoardLogger, 'torch.utils.tensorboard', 'tensorboard'),
                                              (MLflowLogger, 'mlflow', 'mlflow')])
def test_a_missing_package_names_the_extra(monkeypatch, cls, module, extra):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=rf'{cls.__name__} needs the `{extra}` package: pip install "aisaac\[{extra}\]"'): cls()

def test_image_arrays():
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    assert _image_array(torch.ones(3, 4, 5)).shape == (4, 5, 3) and _image_array(torch.ones(3, 4, 5)).max() == 255
    assert _image_array(torch.zeros(4, 5)).shape == (4, 5, 3)
    fig = plt.figure(figsize=(2, 1), dpi=50)
    assert _image_array(fig).shape == (50, 100, 3); plt.close(fig)
    with pytest.raises(ValueError, match="HxW"): _image_array(torch.zeros(2, 3, 4, 5))

def test_run_config_names_the_settings():
    t = fit(n_epochs=1)
    cfg = run_config(t)
    assert cfg | {'callbacks': ''} == {'n_epochs': 1, 'lr': 0.05, 'opt_func': 'Adam', 'loss_func': 'CrossEntropyLoss',
                                       'model': 'Linear', 'n_params': 10, 'callbacks': ''}
    assert 'MetricsCB' in cfg['callbacks']

# ---------------------------------------------------------------- results file
from aisaac.callbacks.results import ResultsFileCB

def test_results_file_records_the_run(tmp_path):
    path = tmp_path/'r'/'results.jsonl'
    t = fit(ResultsFileCB(path, config={'seed': 0, 'data': 'synthetic'}), LogBatches())
    recs = [json.loads(l) for l in open(path)]
    assert [r['event'] for r in recs] == ['run_start', 'epoch', 'epoch', 'epoch', 'run_stop']
    assert len({r['run'] for r in recs}) == 1
    assert recs[0]['config'] == run_config(t) | {'seed': 0, 'data': 'synthetic'} and recs[0]['system']['torch'] == torch.__version__
    assert [r['epoch'] for r in recs[1:4]] == [0, 1, 2]
    for name in HIST: assert [r['metrics'][name] for r in recs[1:4]] == t.history.get_metric_values(name)
    assert 'seen' not in recs[1]['metrics']  # per-batch values are not a result
    stop = recs[-1]
    assert (stop['status'], stop['error'], stop['epochs']) == ('ok', None, 3)
    assert stop['result'] == {n: t.history.get_latest_metric(n) for n in HIST}
    times = [r['time'] for r in recs]
    assert times == sorted(times) and stop['duration_s'] >= 0

def test_results_file_is_flushed_each_epoch_and_ends_a_failed_run(tmp_path):
    path = tmp_path/'results.jsonl'
    probe = ReadEachEpoch(lambda: [json.loads(l)['event'] for l in open(path)])
    with pytest.raises(RuntimeError, match='boom'): fit(ResultsFileCB(path), probe, FailAt(2))
    assert probe.seen == [['run_start', 'epoch'], ['run_start', 'epoch', 'epoch']]
    recs = [json.loads(l) for l in open(path)]
    assert (recs[-1]['event'], recs[-1]['status'], recs[-1]['error'], recs[-1]['epochs']) == ('run_stop', 'error', 'RuntimeError: boom', 2)
    fit(ResultsFileCB(path), n_epochs=1)  # a second run is appended, with its own id
    recs = [json.loads(l) for l in open(path)]
    assert [r['event'] for r in recs].count('run_start') == 2 and len({r['run'] for r in recs}) == 2

def test_results_file_that_cannot_be_made_stops_the_fit_at_set_up(tmp_path):
    "A benchmark run whose results file cannot be made would train for nothing: its error stops the fit before the first batch"
    (tmp_path/'file').write_text('')
    w = Weights()
    with pytest.raises(FileExistsError) as e: fit(ResultsFileCB(tmp_path/'file'/'r.jsonl'), w)
    assert any('ResultsFileCB.before_fit' in n for n in e.value.__notes__) and w.batches == 0

# ---------------------------------------------------------------- a logger writes per-batch values in chunks
class Got(Logger):
    "A logger that records each value it writes, with the trainer's batch and pass when it wrote it"
    def __init__(self): super().__init__('all'); self.got = []
    def write(self, t, metrics, step, per): self.got.append((per, step, dict(metrics), t.batch_num, t.training))

class LogEach(Callback):
    "Logs the batch's number at every batch of both passes, and a per-epoch value after each pass"
    order = -5
    def after_batch(self, t): t.log({'b': t.batch_num, 'train': t.training}, step=t.batch_num, per='batch')
    def after_epoch(self, t): t.log({'pass_end': t.batch_num}, step=t.epoch)

def chunk_fit(*cbs, chunk=None, secs=None, n_epochs=1, **kw):
    t = Trainer(cls_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, nn.Linear(4, 2), callbacks=[BasicTrainCB(), *cbs])
    for cb in cbs:
        if isinstance(cb, Logger) and chunk is not None: cb.chunk = chunk
        if isinstance(cb, Logger) and secs is not None: cb.chunk_secs = secs
    t.fit(n_epochs, lr=0.1, **kw)
    return t

def test_a_logger_writes_per_batch_values_in_chunks_every_value_in_order():
    "In a pass, `chunk` values at once, the rest at the pass's end; the epoch's values after them; the order is the order logged"
    g = Got(); chunk_fit(LogEach(), g, chunk=3, n_epochs=2)
    sent = [(per, step, m.get('b', m.get('pass_end'))) for per, step, m, _, _ in g.got]
    want = []
    for epoch in range(2):
        for n in (4, 2):  # 4 training batches, then 2 validation batches
            want += [('batch', b, b) for b in range(n)] + [('epoch', epoch, n)]
    assert sent == want
    train0 = [(b, at) for per, _, m, at, tr in g.got[:4] if per == 'batch' for b in [m['b']]]
    assert train0 == [(0, 2), (1, 2), (2, 2), (3, 4)]  # three sent at batch 2, the last at the pass's end (the count is past the last batch)
    g1 = Got(); chunk_fit(LogEach(), g1, chunk=1)
    assert all(m['b'] == at for per, _, m, at, _ in g1.got if per == 'batch')  # `chunk = 1`: each written at once
    g0 = Got(); chunk_fit(LogEach(), g0, secs=0)
    assert all(m['b'] == at for per, _, m, at, _ in g0.got if per == 'batch')  # a value held longer than `chunk_secs` goes at once
    assert Logger.chunk == 50 and Logger.chunk_secs == 1.0

def test_held_values_go_first_before_images_text_and_epoch_values_and_history_is_at_once():
    class Mixed(Callback):
        def after_batch(self, t):
            if not t.training: return
            t.history.update_metric('b', t.batch_num, step=t.batch_num, per='batch')
            t.log({'b': t.batch_num}, step=t.batch_num, per='batch')
            assert t.history.get_metric_values('b', per='batch')[-1] == t.batch_num  # the history has it now
            if t.batch_num == 1: t.log_text('note', 'after batch 1')
            if t.batch_num == 2: t.log({'mid': 1.0}, step=0)
    class Seq(Got):
        def log_text(self, t, name, text, step=None):
            self.write_held(t)  # what it holds goes first, as the loggers of the library do
            self.got.append(('text', None, {'b': text}, t.batch_num, t.training))
    s = Seq(); chunk_fit(Mixed(), s, valid=False)
    assert [(per, m) for per, _, m, _, _ in s.got] == [('batch', {'b': 0}), ('batch', {'b': 1}), ('text', {'b': 'after batch 1'}),
                                                        ('batch', {'b': 2}), ('epoch', {'mid': 1.0}), ('batch', {'b': 3})]

def test_values_held_when_a_pass_fails_reach_the_loggers_and_the_file(tmp_path):
    "An error in the middle of a pass: what was logged before it is written, before `on_exception` and the loggers' `cleanup_fit`"
    class FailAtBatch(Callback):
        order = -10
        def after_batch(self, t):
            if t.training and t.batch_num == 3: raise RuntimeError('boom')
    class WhenFailed(Callback):
        def on_exception(self, t, exception): self.had = [m['b'] for per, _, m, _, _ in g.got if per == 'batch']
    g, w = Got(), WhenFailed()
    with pytest.raises(RuntimeError, match='boom'): chunk_fit(LogEach(), FailAtBatch(), g, w, JSONLinesLogger(tmp_path/'l.jsonl'))
    assert w.had == [0, 1, 2]  # LogEach (order -5) ran after FailAtBatch (order -10) raised: batch 3 logged nothing
    assert [json.loads(l)['b'] for l in open(tmp_path/'l.jsonl')] == [0, 1, 2]

def test_a_pass_inside_a_pass_sends_the_outer_values_first():
    "A callback that validates in the middle of a training pass (its own sub-run): the order stays the order logged"
    class MidValid(Callback):
        order = 10
        def after_batch(self, t):
            if t.training and t.batch_num == 1:
                dl, batch_num = t.dl, t.batch_num
                t.one_epoch(False); t.model.train(); t.dl, t.batch_num = dl, batch_num
    g = Got(); chunk_fit(LogEach(), MidValid(), g, valid=False)
    seq = [(tr, m.get('b')) for per, _, m, _, _ in g.got if per == 'batch' for tr in [m['train']]]
    assert seq == [(True, 0), (True, 1), (False, 0), (False, 1), (True, 2), (True, 3)]

def test_a_training_only_fit_appends_its_csv_rows_with_the_monitors_epoch_values(tmp_path, monkeypatch):
    "The loggers flush after the pass (not at `cleanup_epoch`): `SpeedMonitorCB`'s `after_train` values are in the row, no rewrite"
    import aisaac.callbacks.loggers as lg
    from aisaac.callbacks.monitors import SpeedMonitorCB
    from aisaac.callbacks.results import ResultsFileCB
    replaced = []
    monkeypatch.setattr(lg.os, 'replace', lambda a, b: (replaced.append(b), __import__('os').rename(a, b)))
    t = fit(CSVLogger(tmp_path/'e.csv'), SpeedMonitorCB(), ResultsFileCB(tmp_path/'r.jsonl'), n_epochs=4, valid=False)
    assert replaced == [tmp_path/'e.csv'] * 2  # the empty file at the start, the first row with its header; then appends
    rows = list(csv.DictReader(open(tmp_path/'e.csv')))
    assert [float(r['train_time']) for r in rows] == t.history.get_metric_values('train_time') and len(rows) == 4
    epochs = [json.loads(l) for l in open(tmp_path/'r.jsonl') if '"epoch"' in l and json.loads(l)['event'] == 'epoch']
    assert [r['metrics']['train_time'] for r in epochs] == t.history.get_metric_values('train_time')

def test_a_logger_that_fails_on_a_held_value_is_switched_off_once():
    "A chunk of held values: the logger that fails on one warns once and gets none of the rest; the others get them all"
    class Flaky(Got):
        on_error = 'warn'
        def write(self, t, metrics, step, per):
            if per == 'batch' and metrics['b'] == 1: raise OSError('disk gone')
            super().write(t, metrics, step, per)
    f, g = Flaky(), Got()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        chunk_fit(LogEach(), f, g, valid=False)
    assert sum('disk gone' in str(w.message) for w in ws) == 1
    assert [m['b'] for per, _, m, _, _ in f.got if per == 'batch'] == [0]
    assert [m['b'] for per, _, m, _, _ in g.got if per == 'batch'] == [0, 1, 2, 3]


def test_a_value_logged_without_a_step_goes_with_its_epoch_in_every_logger(tmp_path, capsys):
    "A callback's `trainer.log({'seen': epoch})` after `MetricsCB`'s row: in the CSV row, the JSON line and the printed line of that epoch (before: one epoch late, 1, 2, 3, and an extra row 3 without losses, as the CSV and JSON-lines loggers counted one step for every name)"
    class Seen(Callback):
        order = MetricsCB.order + 1
        def after_epoch(self, t):
            if not t.model.training: t.log({'seen': float(t.epoch)})
    torch.manual_seed(0)
    x = torch.randn(32, 4); y = (x[:, 0] > 0).long(); b = [(x[i:i + 16], y[i:i + 16]) for i in (0, 16)]
    t = Trainer(SimpleNamespace(train=b, valid=b), nn.CrossEntropyLoss(), torch.optim.SGD, nn.Linear(4, 2),
                callbacks=[BasicTrainCB(), MetricsCB(show=False), Seen(), CSVLogger(tmp_path/'l.csv'), JSONLinesLogger(tmp_path/'l.jsonl'), ConsoleLogger()])
    t.fit(3)
    rows = list(csv.DictReader(open(tmp_path/'l.csv')))
    assert [(r['epoch'], r['seen']) for r in rows] == [('0', '0.0'), ('1', '1.0'), ('2', '2.0')] and all(r['valid_loss'] for r in rows)
    lines = [json.loads(l) for l in open(tmp_path/'l.jsonl')]
    assert [(l['step'], l['seen']) for l in lines if 'seen' in l] == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert [l for l in capsys.readouterr().out.splitlines() if 'seen' in l] == [f'epoch {e}: seen {e}' for e in range(3)]

@pytest.mark.parametrize('name', ['CSVLogger', 'JSONLinesLogger', 'CheckpointCB'])
def test_a_sub_run_leaves_the_runs_files_as_they_were(name):
    """Found by the invariance harness (issue 51): capture_preds and Interpretation ran the writers, so log.csv / log.jsonl gained the
    sub-run's validation line and CheckpointCB wrote checkpoint_0002_000000.pt; the writers have `sub_runs = False`, which a sub-run switches off"""
    from aisaac.coverage import check
    assert check([name], 'transactions') == []

def test_a_writer_with_sub_runs_on_writes_the_sub_runs_line(tmp_path):
    "`sub_runs = True` keeps a writer on in a sub-run: the CSV log gains capture_preds's validation line, as before"
    from aisaac.invariants import tiny_trainer
    from aisaac.callbacks.loggers import CSVLogger
    from aisaac.callbacks.metrics import MetricsCB
    import aisaac.callbacks.preds
    t = tiny_trainer([MetricsCB(show=False), off := CSVLogger(tmp_path/'off.csv'), on := CSVLogger(tmp_path/'on.csv')])
    on.sub_runs = True
    t.fit(1, lr=1e-2)
    t.capture_preds()
    assert len((tmp_path/'off.csv').read_text().splitlines()) == 2 and len((tmp_path/'on.csv').read_text().splitlines()) == 3

def test_a_sub_run_leaves_tensorboards_scalars_as_they_were():
    """Found by the invariance harness (issue 51): capture_preds and Interpretation wrote an event file of their own, and the event files'
    names (the clock, the process id, a count in the process) differ between two runs; the writer is off in a sub-run, and the harness
    compares a folder's event files by the scalars TensorBoard reads from them"""
    pytest.importorskip('tensorboard')
    from aisaac.coverage import check
    assert check(['TensorBoardLogger'], 'transactions') == []

def test_mlflow_on_a_file_store_keeps_the_run_when_two_names_cannot_both_be_files(tmp_path, monkeypatch):
    """MLflow's file store keeps `batch/grad_norm` as a file and `batch/grad_norm/<param>` in a folder of that name: the batch of values
    failed ('[Errno 20] Not a directory'), the logger was switched off, and the run held no train_loss or valid_loss at all"""
    pytest.importorskip('mlflow')
    from mlflow.tracking import MlflowClient
    from aisaac.callbacks.monitors import GradNormCB
    monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')
    lg = MLflowLogger(f'file://{tmp_path}/mlruns', experiment='x')
    with pytest.warns(UserWarning, match=r"cannot hold both 'batch/grad_norm' and 'batch/grad_norm/weight'.*GradNormCB\(per_layer=False\)") as ws:
        t = fit(lg, GradNormCB())
    assert len([w for w in ws if 'MLflowLogger' in str(w.message)]) == 1  # once, not once a parameter
    c = MlflowClient(lg.tracking_uri)
    for name in HIST: assert [m.value for m in c.get_metric_history(lg.run_id, name)] == t.history.get_metric_values(name)
    assert len(c.get_metric_history(lg.run_id, 'batch/grad_norm')) == len(t.history.get_metric_values('grad_norm', per='batch')) > 0
    assert c.get_run(lg.run_id).info.status == 'FINISHED'

def test_tensorboard_says_so_when_a_new_run_writes_into_another_runs_folder(tmp_path):
    """A script run twice with `TensorBoardLogger(log_dir)` gave TensorBoard one run: valid_loss at steps 0, 1, 2, 0, 1, 2, silently
    (the CSV and JSON-lines files of the same run start afresh, MLflow makes a new run); a second fit of the same run, and a resume, are one run"""
    pytest.importorskip('tensorboard')
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        t = fit(lg := TensorBoardLogger(tmp_path/'tb'))
        t.fit(1)  # the same run, on: no warning
    with pytest.warns(UserWarning, match=r"holds the event files of another run.*its own folder"):
        fit(TensorBoardLogger(tmp_path/'tb'))

def test_a_csv_file_says_so_when_a_fit_numbers_its_rows_in_another_unit(tmp_path):
    """fit(2) then fit(steps=4, valid_every=2) into one CSVLogger: the file's first column became `step` over 0, 1, 18, 20, where rows 0
    and 1 were epochs, silently (the JSON-lines file says `epoch` or `interval` on each line)"""
    import warnings
    t = fit(CSVLogger(tmp_path/'m.csv'), n_epochs=2)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        t.fit(1)  # the same unit: no warning
    with pytest.warns(UserWarning, match=r"numbered by step and the 3 rows of the earlier fits .* by epoch.*a CSVLogger of its own"):
        t.fit(steps=4, valid_every=2)

def test_values_logged_without_a_step_get_the_same_steps_in_every_logger(tmp_path, monkeypatch):
    """A callback logs `a` every epoch and `b` from the second on, together and with `step=None`: the CSV and JSON-lines files put `b` at
    epochs 1 and 2 (one step a row), TensorBoard and MLflow at 0 and 1 (each name its own count). Now every logger: 1 and 2"""
    pytest.importorskip('tensorboard'); pytest.importorskip('mlflow')
    import csv, json
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    class Mine(Callback):
        def after_epoch(self, t):
            if t.training: t.log({'a': 1. + t.epoch, **({'b': 20. + t.epoch} if t.epoch else {})})
    lg = MLflowLogger(f'sqlite:///{tmp_path}/mlruns.db', experiment='x')
    monkeypatch.chdir(tmp_path)
    fit(CSVLogger(tmp_path/'m.csv'), JSONLinesLogger(tmp_path/'m.jsonl'), TensorBoardLogger(tmp_path/'tb'), lg, Mine())
    assert [int(r['epoch']) for r in csv.DictReader(open(tmp_path/'m.csv')) if r['b']] == [1, 2]
    assert [l['step'] for l in map(json.loads, open(tmp_path/'m.jsonl')) if 'b' in l] == [1, 2]
    ea = EventAccumulator(str(tmp_path/'tb')); ea.Reload()
    assert [e.step for e in ea.Scalars('b')] == [1, 2] and [e.step for e in ea.Scalars('a')] == [0, 1, 2]
    assert [m.step for m in MlflowClient(lg.tracking_uri).get_metric_history(lg.run_id, 'b')] == [1, 2]
