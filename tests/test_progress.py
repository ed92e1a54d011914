"Progress: clean output to a pipe, the live loss graph (one point per training batch), no host sync per batch, printed progress."
import io, re, subprocess, sys, textwrap
from types import SimpleNamespace
import pytest, torch
from torch import nn
from aisaac.trainer import Trainer
from aisaac.core.callback import Callback
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
import aisaac.callbacks.progress as progress
from aisaac.callbacks.progress import ProgressCB, PrintProgressCB

def cls_dls(n_batches=20, bs=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_batches * bs, 4, generator=g); y = (x[:, 0] > 0).long()
    batches = [(x[i:i+bs], y[i:i+bs]) for i in range(0, len(x), bs)]
    return SimpleNamespace(train=batches, valid=batches[:5])

def trainer(*cbs, n_batches=20, opt_func=torch.optim.Adam):
    torch.manual_seed(0)
    return Trainer(cls_dls(n_batches), nn.CrossEntropyLoss(), opt_func, nn.Linear(4, 2),
                   callbacks=[BasicTrainCB(), MetricsCB(), *cbs])

SCRIPT = textwrap.dedent('''
    import sys; sys.path.insert(0, {tests!r})
    from test_progress import trainer
    from aisaac.callbacks.progress import ProgressCB, PrintProgressCB
    trainer(ProgressCB(plot={plot}), PrintProgressCB(), n_batches=50).fit(3, lr=0.01)
''')

@pytest.mark.parametrize('plot', [False, True])
def test_output_to_a_pipe_is_clean_and_short(plot):
    "Run in a subprocess writing to a pipe, as in CI: no bars, no control characters, a few lines"
    tests = str(__import__('pathlib').Path(__file__).parent)
    res = subprocess.run([sys.executable, '-c', SCRIPT.format(tests=tests, plot=plot)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert not re.search(r'[\x00-\x08\x0b-\x1f\x7f]', out), repr(out[:300])  # no \r, no escape sequences, no backspaces
    lines = out.splitlines()
    assert len(lines) < 100
    assert lines[0] == 'fit: 3 epochs at lr 0.01, 50 training batches per epoch'
    assert lines[1].split() == ['epoch', 'train', 'valid']  # ProgressCB's table header
    assert sum(l.startswith('epoch ') and '/3 (' in l for l in lines) == 3 and lines[-1].startswith('fit done in')
    assert len(lines) == 1 + 1 + 3 * 2 + 1

def test_plot_has_one_point_per_training_batch_and_valid_points_at_epoch_ends():
    t = trainer(ProgressCB(plot=True, bars=False), n_batches=7)
    with __import__('contextlib').redirect_stdout(io.StringIO()): t.fit(3, lr=0.01)
    p = t.ProgressCB
    assert p.train_losses == pytest.approx([r['loss'] for r in t.MetricsCB.losses_batch if r['training']])
    assert [x for x, _ in p.valid_losses] == [7, 14, 21]
    assert [v for _, v in p.valid_losses] == t.history.get_metric_values('valid_loss')
    ax = p.loss_figure().axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ('training batches', 'loss') and ax.get_title()
    assert [len(l.get_xdata()) for l in ax.lines] == [21, 3]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ['train (per batch)', 'valid (per epoch)']

def test_live_graph_in_a_notebook_is_redrawn_with_every_point(monkeypatch, capsys):
    "Pretend to be in a notebook: the graph is displayed once, then updated, and ends with every batch's point"
    pytest.importorskip('IPython')
    import IPython.display
    shown = []
    class Handle:
        def update(self, fig): shown.append([len(l.get_xdata()) for l in fig.axes[0].lines])
    def display(fig, display_id=None):
        shown.append([len(l.get_xdata()) for l in fig.axes[0].lines]); return Handle()
    monkeypatch.setattr(progress, 'IN_NOTEBOOK', True)
    monkeypatch.setattr(IPython.display, 'display', display)
    t = trainer(ProgressCB(plot=True, bars=True, refresh=3600), n_batches=6)
    t.fit(2, lr=0.01)
    assert shown[0] == [1] and shown[-1] == [12, 2]  # the first batch, then at the end all 12 batches and 2 valid points
    assert len(shown) >= 1 + 2  # at least once per epoch besides the first draw

class CountItems(Callback):
    "Counts `Tensor.item` calls (host syncs) during the fit"
    def before_fit(self, t):
        self.n, real = 0, torch.Tensor.item
        def item(x): self.n += 1; return real(x)
        self.real, torch.Tensor.item = real, item
    def cleanup_fit(self, t): torch.Tensor.item = self.real

@pytest.mark.parametrize('plot', [False, True])
def test_no_host_sync_per_batch(plot, capsys):
    "With bars drawn, the loss is read at most every `refresh` seconds; with the graph, the kept losses are read in one go"
    cnt = CountItems()
    t = trainer(ProgressCB(plot=plot, bars=True, refresh=3600), cnt, n_batches=40, opt_func=torch.optim.SGD)  # (Adam reads its step count with `item`)
    t.fit(2, lr=0.01)
    assert cnt.n <= 1 + 2 * 2  # the bar's first reading, MetricsCB's one per pass; not 80 batches' worth

def test_print_progress_says_how_the_fit_ended():
    class Fail(Callback):
        def before_epoch(self, t):
            if t.epoch == 1: raise RuntimeError('boom')
    out = io.StringIO()
    with pytest.raises(RuntimeError): trainer(PrintProgressCB(file=out), Fail()).fit(3)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[1].startswith('epoch 1/3') and lines[2].startswith('fit stopped by an error in')
    out = io.StringIO()
    trainer(PrintProgressCB(file=out)).fit(2, train=False)  # validation only: still one line per epoch
    assert [l.split(' (')[0] for l in out.getvalue().splitlines()[1:3]] == ['epoch 1/2', 'epoch 2/2']

class _SlowValid(Callback):
    "Makes each epoch's validation pass take `secs` seconds"
    def __init__(self, secs): self.secs = secs
    def before_validate(self, trainer): __import__('time').sleep(self.secs)

def test_times_column_measures_the_whole_epoch(capsys):
    "`times=True`: a `time` column per epoch (mm:ss) that counts the validation pass too; without it, no column"
    t = trainer(ProgressCB(bars=False, times=True), _SlowValid(1.2))
    t.fit(2, lr=0.01)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ['epoch', 'train', 'valid', 'time']
    assert [l.split()[-1] for l in lines[1:]] == ['00:01', '00:01']
    assert 'time' not in t.history.metric_names  # a display column, not a metric
    trainer(ProgressCB(bars=False)).fit(1, lr=0.01)
    assert capsys.readouterr().out.splitlines()[0].split() == ['epoch', 'train', 'valid']

# ---------------------------------------------------------------- an output nobody reads any more
class GoneOutput(io.StringIO):
    "Stands for the standard output of a job whose reader is gone: every write raises, as a closed pipe does"
    def write(self, s): raise BrokenPipeError(32, 'Broken pipe')

@pytest.mark.parametrize('displays', ['MetricsCB alone', 'ProgressCB', 'PrintProgressCB', 'ConsoleLogger'])
def test_a_display_that_cannot_print_warns_once_and_the_fit_goes_on(displays, monkeypatch):
    "With stdout gone, the epoch table, the progress lines and the console log warn once; the fit trains to its end"
    from aisaac.callbacks.loggers import ConsoleLogger
    cbs = {'MetricsCB alone': [], 'ProgressCB': [ProgressCB(bars=False)], 'PrintProgressCB': [PrintProgressCB()],
           'ConsoleLogger': [ConsoleLogger()]}[displays]
    t = trainer(*cbs)
    w0 = t.model.weight.detach().clone()
    monkeypatch.setattr(sys, 'stdout', GoneOutput())
    with pytest.warns(UserWarning) as ws: t.fit(3, lr=0.01)
    assert len(t.history.get_metric_values('valid_loss')) == 3 and not torch.equal(t.model.weight, w0)
    assert len(ws) <= 2, [str(w.message) for w in ws]  # once per display that failed, not once per epoch

def test_a_stopper_stops_cleanly_when_it_cannot_print_its_reason(monkeypatch):
    "The reason is kept and warned about; the fit ends as cancelled, not with an I/O error"
    from aisaac.callbacks.stoppers import EarlyStoppingCB
    t = trainer(EarlyStoppingCB(patience=1, threshold=10.))
    monkeypatch.setattr(sys, 'stdout', GoneOutput())
    with pytest.warns(UserWarning, match='EarlyStoppingCB: valid_loss has not improved'): t.fit(5, lr=0.01)
    assert t.outcome == 'cancelled' and t.epoch == 1

PIPE_SCRIPT = textwrap.dedent('''
    import sys, time, torch; sys.path.insert(0, {tests!r})
    from test_progress import trainer
    from aisaac.callbacks.progress import PrintProgressCB
    time.sleep(1)  # the reader closes the pipe meanwhile
    t = trainer(PrintProgressCB(), n_batches=50)
    t.fit(3, lr=0.01)
    open({done!r}, 'w').write(f"{{len(t.history.get_metric_values('valid_loss'))}} {{t.outcome}}")
''')

def test_training_goes_on_when_the_pipe_reader_is_gone(tmp_path):
    "A real pipe whose reader closed it (`python train.py | head -1`): the run trains to its end"
    tests, done = str(__import__('pathlib').Path(__file__).parent), str(tmp_path/'done.txt')
    p = subprocess.Popen([sys.executable, '-c', PIPE_SCRIPT.format(tests=tests, done=done)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    _, err = p.communicate(timeout=300)
    assert open(done).read() == '3 ok', err.decode()[-2000:]

class _LineAtTheEnd(Callback):
    "Writes a line through the display in the first epoch and one after the last, as `SampleCB`'s samples during a fit of steps and at its end"
    def after_batch(self, t):
        if t.training and t.clock.step == 1: t.log_text('sample', 'the start', step=1)
    def after_fit(self, t): t.log_text('sample', 'the end', step=t.clock.step)

@pytest.mark.parametrize('fit', ['epochs', 'steps'])
def test_the_lines_written_stay_under_the_table_and_no_bar_stays_in_the_notebook(monkeypatch, fit):
    "In a notebook, what stays in the cell is the table and every line written under it (samples), though rows came after a line and a line after the bars' end"
    pytest.importorskip('IPython')
    import IPython.display
    from fastcore.xml import to_xml
    import fastprogress.fastprogress as fp
    handles = []
    class Handle:
        def __init__(self, obj): self.last = obj
        def update(self, obj): self.last = obj
    def display(obj, display_id=None):
        handles.append(Handle(obj)); return handles[-1]
    monkeypatch.setattr(progress, 'IN_NOTEBOOK', True)
    monkeypatch.setattr(progress, 'master_bar', fp.NBMasterBar)
    monkeypatch.setattr(progress, 'progress_bar', fp.NBProgressBar)
    monkeypatch.setattr(IPython.display, 'display', display)
    t = trainer(ProgressCB(bars=True), _LineAtTheEnd(), n_batches=6)
    t.fit(*((2,) if fit == 'epochs' else ()), **({} if fit == 'epochs' else {'steps': 10, 'valid_every': 4}), lr=0.01)
    shown = [h.last.data if isinstance(h.last, IPython.display.HTML) else to_xml(h.last) for h in handles]
    html = next(h for h in shown if '<table' in h)  # the master bar's cell: bars, the table, the lines
    assert '<table' in html and 'sample (step 1): the start' in html and 'the end' in html, html  # (before: the next row's table wiped the first line)
    assert '<progress' not in html, html  # (before: both bars redrawn by the last line's write, and left there)
    assert html.count('<tr>') == 1 + (2 if fit == 'epochs' else 3) and html.index('the start') > html.index('</table>'), html  # the rows, then the lines under them
