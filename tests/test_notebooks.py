"""The notebooks in a real Jupyter kernel, as a person runs them (nbdev-test has no kernel).

The first import prints nothing; fastprogress draws HTML bars and an HTML epoch table; the tutorial's fast
path runs and shows its table, its plots as images, highlighted source and the callback summary; the
tutorials and guides are saved with their outputs, and nbdev-clean keeps them.
Needs the `docs` extra (nbclient, ipykernel, ipywidgets), which `make setup` installs.
"""
import functools, importlib.util, itertools, json, re, subprocess, sys
from pathlib import Path

import pytest

nbclient = pytest.importorskip('nbclient', reason='the docs extra is not installed: pip install -e ".[docs]"')
from jupyter_client.manager import start_new_kernel

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location('run_nbs', ROOT/'scripts'/'run_nbs.py')
run_nbs = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(run_nbs)

@pytest.fixture(scope='module')
def kernel():
    "A fresh kernel of this environment, as `make docs` starts it"
    km, kc = start_new_kernel(kernel_name='python3', env=run_nbs.KERNEL_ENV)
    yield kc
    kc.stop_channels(); km.shutdown_kernel(now=True)

def execute(kc, code, timeout=120):
    "Run `code` in the kernel: the iopub messages it sent (outputs, display updates) and its reply"
    msgs = []
    reply = kc.execute_interactive(code, output_hook=msgs.append, timeout=timeout)
    return msgs, reply['content']

def test_first_import_in_a_fresh_kernel_prints_nothing(kernel):
    "No warning (tqdm's red 'IProgress not found' came from `datasets` importing tqdm.auto without ipywidgets)"
    msgs, reply = execute(kernel, 'from aisaac.all import *')
    assert reply['status'] == 'ok', reply
    shown = [m['content'] for m in msgs if m['msg_type'] in ('stream', 'display_data', 'error')]
    assert shown == [], shown

def test_progress_bars_and_table_are_html(kernel):
    "During a fit the bars are HTML `<progress>` elements, updated in place; the epoch table stays, as HTML"
    code = '''
from tests.tiny import make_dls
torch.manual_seed(0)
trainer = Trainer(make_dls(n_train=(8,)*6, n_valid=(8,)*2), nn.MSELoss(), torch.optim.SGD, model=nn.Linear(2, 1),
                  callbacks=[BasicTrainCB(), MetricsCB(), ProgressCB()])
trainer.fit(2)'''
    execute(kernel, f'import sys; sys.path.insert(0, {str(ROOT)!r})')
    msgs, reply = execute(kernel, code)
    assert reply['status'] == 'ok', reply
    html = [''.join(m['content']['data'].get('text/html', '')) for m in msgs
            if m['msg_type'] in ('display_data', 'update_display_data')]
    assert any('<progress' in h for h in html), html
    assert any(m['msg_type'] == 'update_display_data' for m in msgs)  # one bar, redrawn in place
    tables = [h for h in html if '<table' in h]
    assert tables and '<th>valid</th>' in tables[-1] and tables[-1].count('<tr>') == 3, tables  # header + 2 epochs
    assert not any(m['msg_type'] == 'stream' and m['content']['name'] == 'stderr' for m in msgs)

def test_a_fit_cut_short_leaves_its_table_and_no_bar(kernel):
    "A fit that a callback cancels (or a run in steps that ends inside an epoch) closes its bars: the page keeps the table alone"
    code = '''
class StopAfter(Callback):
    def after_epoch(self, trainer):
        if not trainer.training and trainer.epoch == 1: raise CancelFitException()
torch.manual_seed(0)
trainer = Trainer(make_dls(n_train=(8,)*6, n_valid=(8,)*2), nn.MSELoss(), torch.optim.SGD, model=nn.Linear(2, 1),
                  callbacks=[BasicTrainCB(), MetricsCB(), ProgressCB(), StopAfter()])
trainer.fit(5)'''
    execute(kernel, f'import sys; sys.path.insert(0, {str(ROOT)!r}); from aisaac.all import *; from tests.tiny import make_dls')
    msgs, reply = execute(kernel, code)
    assert reply['status'] == 'ok', reply
    shown = {}  # what each display shows in the end, after its updates
    for m in msgs:
        if m['msg_type'] in ('display_data', 'update_display_data'):
            shown[m['content'].get('transient', {}).get('display_id') or id(m)] = ''.join(m['content']['data'].get('text/html', ''))
    final = [h for h in shown.values() if '<table' in h]
    assert len(final) == 1 and final[0].count('<tr>') == 3, final  # header + the 2 epochs done
    assert not [h for h in shown.values() if '<progress' in h], shown

def _outputs(nb, contains):
    "The outputs of the code cell whose source contains `contains`"
    cells = [c for c in nb.cells if c.cell_type == 'code' and contains in c.source]
    assert len(cells) == 1, (contains, len(cells))
    return cells[0].outputs

def _mimes(outs): return {k for o in outs for k in o.get('data', {})}

def test_tutorial_fast_path_in_a_kernel():
    "The callbacks tutorial, slow cells skipped: tables as HTML, plots as PNG, source highlighted, the summary as a table"
    nb = rerun('tutorials/callbacks.ipynb')
    assert 'image/png' in _mimes(_outputs(nb, 'dls.show_batch()'))
    fit = ''.join(''.join(o['data'].get('text/html', '')) for o in _outputs(nb, 'ProgressCB()])\ntrainer.fit(1)'))
    assert '<table' in fit and '<th>Accuracy</th>' in fit, fit
    src = _outputs(nb, 'view_source_code(BasicTrainCB)')
    assert 'class="highlight"' in ''.join(src[0]['data']['text/html'])
    summary = ''.join(_outputs(nb, 'trainer.summarize_callbacks()')[0]['data']['text/markdown'])
    assert summary.startswith('| event | callback | order | does |') and '| predict | BasicTrainCB |' in summary, summary
    assert 'image/png' in _mimes(_outputs(nb, 'plt.plot(losses)'))
    assert not any(o.output_type == 'stream' and o.name == 'stderr' for c in nb.cells if c.cell_type == 'code' for o in c.outputs)

@pytest.mark.parametrize('folder', ['tutorials', 'guides'])
def test_tutorials_and_guides_are_saved_with_outputs(folder):
    "What the docs show: each tutorial and guide carries the outputs of a run (`make docs` saves them)"
    nbs = sorted((ROOT/'nbs'/folder).glob('*.ipynb'))
    assert nbs
    for nb in nbs:
        cells = [c for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code']
        if not cells: continue  # a page of prose alone (the contributing page): nothing to run
        with_out = [c for c in cells if c.get('outputs')]
        assert len(with_out) >= max(1, len(cells) // 5), f"{nb.name}: {len(with_out)} of {len(cells)} code cells have outputs: run `make docs`"
        errors = [o for c in cells for o in c.get('outputs', []) if o['output_type'] == 'error']
        assert not errors, f"{nb.name} was saved with an error output"

def test_nbdev_clean_keeps_outputs(tmp_path):
    "nbdev-clean drops execution counts and metadata but keeps what a cell showed"
    nb = {'cells': [{'cell_type': 'code', 'execution_count': 7, 'id': 'abcd1234', 'metadata': {'execution': {'x': 1}},
                     'outputs': [{'output_type': 'display_data', 'metadata': {'width': 3},
                                  'data': {'text/html': ['<table></table>'], 'image/png': 'iVBOR\n'}},
                                 {'output_type': 'stream', 'name': 'stdout', 'text': ['<object at 0x7f00dead>\n']}],
                     'source': ['1']}],
          'metadata': {'kernelspec': {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'},
                       'language_info': {'version': '3.11'}}, 'nbformat': 4, 'nbformat_minor': 5}
    p = tmp_path/'x.ipynb'; p.write_text(json.dumps(nb))
    subprocess.run([str(Path(sys.executable).parent/'nbdev-clean'), '--fname', str(p)], check=True, cwd=ROOT)
    c = json.loads(p.read_text())['cells'][0]
    assert c['execution_count'] is None and c['metadata'] == {}
    assert [o['output_type'] for o in c['outputs']] == ['display_data', 'stream']
    assert c['outputs'][0]['data'] == {'text/html': ['<table></table>'], 'image/png': 'iVBOR'}
    assert c['outputs'][0]['metadata'] == {} and c['outputs'][1]['text'] == ['<object>\n']
    assert 'language_info' not in json.loads(p.read_text())['metadata']

def _text(outs):
    "What a cell's outputs say as text: streams, plain text and HTML"
    res = []
    for o in outs:
        if o['output_type'] == 'stream': res.append(''.join(o['text']))
        for k in ('text/plain', 'text/html', 'text/markdown'): res.append(''.join(o.get('data', {}).get(k, '')))
    return '\n'.join(res)

def test_vision_tutorial_is_saved_with_its_full_data_run():
    "The vision tutorial's saved outputs are a full-data run that reaches 92 % test accuracy within 10 minutes of training, epoch times in the table"
    import nbformat
    nb = nbformat.read(ROOT/'nbs'/'tutorials'/'vision.ipynb', as_version=4)
    assert '(60000, 10000)' in _text(_outputs(nb, 'len(dls.train.dataset), len(dls.valid.dataset)'))  # the full data, not the sample
    outs = _outputs(nb, "train('3. ResNet, augmentation, 10 epochs'")
    m = re.search(r'accuracy ([\d.]+) after 10 epochs, trained in (\d+) s', _text(outs))
    assert m, _text(outs)[-500:]
    assert float(m[1]) >= 0.92 and int(m[2]) <= 600, m[0]
    html = [''.join(o['data']['text/html']) for o in outs if '<table' in ''.join(o.get('data', {}).get('text/html', ''))]
    table = re.findall(r'<tr>.*?</tr>', html[-1], re.S)
    assert '<th>time</th>' in table[0] and len(table) == 11, table[:2]  # header and 10 epochs, each with its time
    assert all(re.search(r'<td>\d\d:\d\d</td>', row) for row in table[1:])
    assert 'image/png' in _mimes(_outputs(nb, 'ActivationStatsCB.plot_stats()'))

def _lm_run():
    "The language-model tutorial's saved run: (steps, validation perplexity)"
    import nbformat
    nb = nbformat.read(ROOT/'nbs'/'tutorials'/'language_model.ipynb', as_version=4)
    m = re.search(r'validation perplexity ([\d.]+) \(bigram [\d.]+, ratio [\d.]+\) after (\d+) steps',
                  _text(_outputs(nb, "final = trainer.history.get_latest_metric('perplexity')")))
    return int(m[2]), float(m[1])

def test_language_model_tutorial_is_saved_with_its_full_run():
    "The language-model tutorial's saved outputs are the full run: validation perplexity at most half the bigram's, within 10 minutes, samples shown"
    import nbformat
    nb = nbformat.read(ROOT/'nbs'/'tutorials'/'language_model.ipynb', as_version=4)
    m = re.search(r'validation perplexity ([\d.]+) \(bigram ([\d.]+), ratio [\d.]+\) after (\d+) steps, [\d,]+ tokens, in (\d+) s',
                  _text(_outputs(nb, "final = trainer.history.get_latest_metric('perplexity')")))
    assert m, 'the saved run printed no result line'
    ppl, bigram, steps, secs = float(m[1]), float(m[2]), int(m[3]), int(m[4])
    assert steps >= 1000 and ppl <= bigram / 2 and secs <= 600, m[0]  # the full run, not the 40-step variant of the tests
    samples = _text(_outputs(nb, "for step, text in trainer.SampleCB.samples"))
    assert samples.count('--- step') >= 4 and 'The meaning of life is' in samples
    assert 'image/png' in _mimes(_outputs(nb, 'finder = make_trainer(model).lr_find('))
    assert 'identical' in _text(_outputs(nb, 'with tempfile.TemporaryDirectory() as d:'))
    hf = re.search(r'GPT-2 \(transformers\) after (\d+) steps: validation perplexity ([\d.]+)', _text(_outputs(nb, "hf_loss = hf_trainer.history")))
    assert hf and int(hf[1]) == 1000 and float(hf[2]) < bigram, 'the Hugging Face section is saved with its 1000-step run'

def test_fine_tuning_tutorial_is_saved_with_its_full_run():
    "The fine-tuning tutorial's saved outputs are its full run: the loss on the answers falls, packing is faster than padding, LoRA trains a small share"
    import nbformat
    nb = nbformat.read(ROOT/'nbs'/'tutorials'/'fine_tuning.ipynb', as_version=4)
    text = _text(_outputs(nb, 'print(f"""validation loss per answer token'))
    m = re.search(r'validation loss per answer token: ([\d.]+) before, ([\d.]+) after full fine-tuning \((\d+) steps', text)
    assert m, 'the saved run printed no summary'
    before, after, steps = float(m[1]), float(m[2]), int(m[3])
    assert steps >= 100 and after < before, m[0]  # the full run, not the 8-step variant of the tests
    p = re.search(r'packing: ([\d,]+) trained tokens/s, padding: ([\d,]+) \(([\d.]+)x\)', text)
    assert p and float(p[3]) > 1, text
    lo = re.search(r'LoRA r=8: ([\d,]+) of ([\d,]+) parameters trained, \d+ s, validation loss ([\d.]+)', text)
    assert lo and int(lo[1].replace(',', '')) < int(lo[2].replace(',', '')) / 10 and float(lo[3]) < before, text
    base = re.search(r"loaded the language-model tutorial's GPT .*: pretrained for (\d+) steps, validation perplexity ([\d.]+)",
                     _text(_outputs(nb, "saved = cache_dir()/'tutorials'/'language_model'")))
    steps, ppl = _lm_run()
    assert base and int(base[1]) == steps and abs(float(base[2]) - ppl) < 0.05, ('the page fine-tunes the language-model tutorial\'s saved run', base, steps, ppl)
    assert _text(_outputs(nb, 'show_answers(full_model)')).count('WordNet, ') == 5
    assert 'image/png' in _mimes(_outputs(nb, 'fig, ax = plt.subplots('))

def test_post_training_tutorial_is_saved_with_its_full_run():
    "The post-training tutorial's saved outputs are its full run and say what its prose says: DPO's held-out gain accuracy above more SFT's, "
    "the distilled students below the student trained alone, the chunked loss keeping at most a quarter of the plain one's memory"
    import nbformat
    nb = nbformat.read(ROOT/'nbs'/'tutorials'/'post_training.ipynb', as_version=4)
    base = re.search(r"loaded the language-model tutorial's GPT: pretrained for (\d+) steps, validation perplexity ([\d.]+)",
                     _text(_outputs(nb, "saved = cache_dir()/'tutorials'/'language_model'")))
    steps, ppl = _lm_run()
    assert base and int(base[1]) == steps and abs(float(base[2]) - ppl) < 0.05, ('the page starts from the language-model tutorial\'s saved run', base, steps, ppl)
    acc = _text(_outputs(nb, "acc |= {'SFT + DPO'"))
    gains = dict(re.findall(r'^ *(SFT \+ [^:]+): accuracy [\d.]+%, gain accuracy ([\d.]+)%', acc, re.M))
    assert set(gains) == {'SFT + DPO', 'SFT + SFT on the chosen'} and float(gains['SFT + DPO']) > float(gains['SFT + SFT on the chosen']) + 5, acc
    assert re.search(r'150 steps of 16 pairs', acc) and '(500 held-out pairs)' in _text(_outputs(nb, 'sft_chosen, sft_rejected = pair_scores')), acc
    kd = dict((k.strip(), float(v)) for k, v in re.findall(r'^ *([^:\n]+): validation loss per answer token ([\d.]+)', _text(_outputs(nb, 'runs = {}')), re.M))
    assert set(kd) == {'labels alone', 'distilled online', 'distilled from stored top-32'}, kd
    assert kd['distilled online'] < kd['labels alone'] and kd['distilled from stored top-32'] < kd['labels alone'], kd
    mem = re.search(r'by the loss: +plain +([\d.]+) MiB, chunked +([\d.]+) MiB', _text(_outputs(nb, 'def saved_mib(fn)')))
    assert mem and float(mem[2]) <= float(mem[1]) / 4, mem
    assert 'image/png' in _mimes(_outputs(nb, 'h = dpo.history'))

def test_transfer_learning_tutorial_is_saved_with_its_full_run():
    "The transfer-learning tutorial's saved outputs are its full run: a pretraining done in it, 500 images to learn from, the four runs of 6 epochs in the table, the figures"
    import nbformat
    nb = nbformat.read(ROOT/'nbs'/'tutorials'/'transfer_learning.ipynb', as_version=4)
    assert '500 training images, 2000 validation images' in _text(_outputs(nb, 'few = sample_dataset_dict(new'))  # not the 100 of the tests
    pre = re.search(r'pretrained on ([\d,]+) images of 5 classes', _text(_outputs(nb, "saved = cache_dir()/'tutorials'/'transfer_learning'")))
    assert pre and int(pre[1].replace(',', '')) == 12_000, 'the page shows its pretraining, on 12,000 images, not weights loaded from a cache'
    table = ''.join(_outputs(nb, "rows = [f\"| {name} |")[0]['data']['text/markdown'])
    rows = dict((name.strip(), (int(e), float(a))) for name, e, a in re.findall(r'^\| ([^|]+) \| (\d+) \| ([\d.]+)% \|', table, re.M))
    assert set(rows) == {'fine_tune', 'from scratch', 'frozen body', 'fine_tune + EMA'} and {e for e, _ in rows.values()} == {6}, table
    assert rows['fine_tune'][1] > rows['from scratch'][1], rows  # what the page says: the pretrained body wins with 500 images
    for cell in ('h = trainer.history', 'interp.plot_confusion_matrix()', 'interp.plot_top_losses('):
        assert 'image/png' in _mimes(_outputs(nb, cell)), cell

# ---------------------------------------------------------------- saved outputs are what the code gives

NOTEBOOKS = sorted(p for p in (ROOT/'nbs').rglob('*.ipynb') if not any(part.startswith(('_', '.')) for part in p.relative_to(ROOT/'nbs').parts))
# Paths of the machine that ran a notebook: the checkout, a home folder, a virtualenv's packages, the kernel's file for a cell
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:home|root|work|Users|mnt|opt|srv)/\S+|\S*site-packages/\S*|\S*/\.venv/\S*|\S*/ipykernel_\d+/\S*")
TEXT_BAR = re.compile(r'\d+\.\d\d% \[\d+/\d+ |[█▉▊▋▌▍▎▏]{2}')  # fastprogress's console bar, tqdm's blocks

def _rel(nb): return nb.relative_to(ROOT/'nbs').as_posix()

def output_problems(cells):
    "What a reader should not see in saved outputs: machine paths, progress bars left behind, a fit's progress table shown more than once"
    res = []
    for i, c in enumerate(cells):
        if c['cell_type'] != 'code': continue
        outs = c.get('outputs', [])
        text, tables = _text(outs), []
        for o in outs: tables += re.findall(r'<table class="fastprogress">.*?</table>', ''.join(o.get('data', {}).get('text/html', '')), re.S)
        res += [f'cell {i}: a path of the machine that ran it: {p!r}' for p in sorted(set(MACHINE_PATH.findall(text)))]
        if '<progress' in text or TEXT_BAR.search(text): res.append(f'cell {i}: a progress bar left in the output')
        rows = [re.findall(r'<tr>.*?</tr>', t, re.S)[1:] for t in tables]  # each table's epochs; a cell of several fits (`fine_tune`) has a table each
        if any(a[:len(b)] == b for j, a in enumerate(rows) for b in rows[:j] + rows[j + 1:]):
            res.append(f'cell {i}: {len(tables)} progress tables in one cell, one of them the start of another (the same fit shown twice)')
    return res

@pytest.mark.parametrize('nb', NOTEBOOKS, ids=_rel)
def test_saved_outputs_show_no_machine_paths_bars_or_repeated_tables(nb):
    "What the docs show is the result, not the machine it ran on: no absolute paths, no bars left behind, one progress table per cell"
    problems = output_problems(json.loads(nb.read_text())['cells'])
    assert not problems, f"{_rel(nb)}: " + '; '.join(problems) + " (fix the code, then save it again with scripts/run_nbs.py, which leaves out machine paths)"

# What a re-run may change: times and rates (a cell's own timing, the `time` column), object ids. Everything else must agree.
VOLATILE = re.compile(r"\b\d+:\d\d(?::\d\d)?\b|[\d.,]+\s*(?:ms|s|sec|seconds?|min|minutes?|µs)\b|[\d.,]+\s*(?:tokens|samples|images|it|batches)/s"
                      r"|\((?:ms|s)\)'?:\s*[\d.e+-]+|0x[0-9a-f]+")
NUMBER = re.compile(r'-?\d+(?:\.\d+)?(?:e[+-]?\d+)?')
TOLERANCE = dict(rel=5e-3, abs=2e-3)  # a figure agrees when |re-run - saved| <= 0.002 + 0.5 % of it: a stale output is far off
# Outputs saved on a CPU of another kind (run_nbs.kernels: AVX2 against AVX-512) sum float32 in another order: a seeded 1-epoch SGD
# run of the first tutorial read valid loss 0.787696 / accuracy 0.696 saved on an AMD EPYC (AVX2) and 0.79509 / 0.691 on a Xeon
# (AVX-512), 0.9 % apart, every other figure of the four pages within TOLERANCE; that cell's momentum SGD at lr 0.1 is chaotic
# enough that 1 thread against 2 on the one Xeon moved it 3.7 % (0.765402 / 0.716 against 0.79509 / 0.691). Across kinds a figure
# agrees within 5 % + 0.02: a table that a code change moved further, or whose text changed, is still found.
ACROSS_KINDS = dict(rel=5e-2, abs=2e-2)

def figures(outs):
    "A cell's outputs as (text with its figures replaced by #, the figures): times and ids left out"
    text = VOLATILE.sub('~', '\n'.join(''.join(o['text']) if o['output_type'] == 'stream' else
                                       ''.join(o.get('data', {}).get('text/markdown', o.get('data', {}).get('text/plain', ''))) for o in run_nbs.coalesce(outs)))  # (pages saved before `write` coalesced)
    return NUMBER.sub('#', text), [float(n) for n in NUMBER.findall(text)]

def drift(saved, rerun, tolerance=TOLERANCE):
    "The cells whose saved outputs a re-run does not give (figures within `tolerance`): [(cell, what differs)]"
    res = []
    for i, (a, b) in enumerate(zip(saved.cells, rerun.cells)):
        if a.cell_type != 'code' or not run_nbs.to_run(a, skip_slow=True): continue
        (sa, fa), (sb, fb) = figures(a.get('outputs', [])), figures(b.get('outputs', []))
        if sa != sb or len(fa) != len(fb):
            la, lb = next(((x, y) for x, y in itertools.zip_longest(sa.splitlines(), sb.splitlines()) if x != y), (sa, sb))
            res.append((i, f'saved {str(la)[:300]!r}, re-run {str(lb)[:300]!r}'))
        elif bad := [(x, y) for x, y in zip(fa, fb) if y != pytest.approx(x, **tolerance)]:
            res.append((i, 'saved/re-run ' + ', '.join(f'{x:g}/{y:g}' for x, y in bad[:6])))
    return res

@functools.cache
def rerun(path):
    """`nbs/<path>` run again in a kernel and cleaned as `make docs` saves it; nothing is written to nbs/. Each slow cell is
    skipped, and the random generators drawn from in its place: the cells after it must not depend on whether it ran. The kernel
    has the torch threads the page was saved with (its metadata; the fast pages are saved with 1: two threads of a kernel beside
    pytest-xdist's other worker on 2 cores ran the first tutorial in 137 s against 11 s)"""
    import nbformat, tempfile
    threads = nbformat.read(ROOT/'nbs'/path, as_version=4).metadata.get('aisaac', {}).get('threads', 'default')
    ok, secs, slow, nb = run_nbs.run(ROOT/'nbs'/path, skip_slow=True, save=False, timeout=600, stand_in=run_nbs.DRAW, threads=threads)
    assert ok, f'{path} failed in a kernel'
    with tempfile.TemporaryDirectory() as d:
        run_nbs.write(nb, Path(d)/'nb.ipynb')
        return nbformat.read(Path(d)/'nb.ipynb', as_version=4)

def test_a_line_printed_in_two_stream_messages_is_the_saved_line():
    "Under load the kernel sent `print`'s text and its newline apart (CI, 2026-11-28): the same output, not a drift"
    import nbformat
    cell = lambda *texts: nbformat.v4.new_code_cell('print(x)', outputs=[nbformat.v4.new_output('stream', name='stdout', text=t) for t in texts])
    nb = lambda *texts: nbformat.v4.new_notebook(cells=[cell(*texts)])
    assert drift(nb("{'epoch': 0, 'train': '0.890'}\n"), nb("{'epoch': 0, 'train': '0.890'}", '\n')) == []
    assert drift(nb("{'epoch': 0, 'train': '0.890'}\n"), nb("{'epoch': 0, 'train': '0.990'}", '\n')) != []  # a figure that moved still does
    assert drift(nb("{'epoch': 0, 'train': '0.890'}\n"), nb("{'epoch': 0, 'train': '0.899'}\n")) != []  # 1 % off: another run
    assert drift(nb("{'epoch': 0, 'train': '0.890'}\n"), nb("{'epoch': 0, 'train': '0.899'}\n"), ACROSS_KINDS) == []  # or another CPU
    assert drift(nb("{'epoch': 0, 'train': '0.890'}\n"), nb("{'epoch': 0, 'train': '0.990'}\n"), ACROSS_KINDS) != []
    saved = run_nbs.sanitise(nb("{'epoch': 0, 'train': '0.890'}", '\n', 'done\n'))  # as `write` saves it: the line is one output
    assert [''.join(o['text']) for o in saved.cells[0].outputs] == ["{'epoch': 0, 'train': '0.890'}\ndone\n"]

FAST = ['tutorials/callbacks.ipynb', 'tutorials/custom_callbacks.ipynb', 'guides/coming_from_pytorch_accelerated.ipynb', 'guides/coming_from_nanogpt.ipynb']

@pytest.mark.parametrize('path', FAST)
def test_saved_outputs_are_what_a_rerun_gives(path):
    """The seeded cells of the fast pages give, run again, the tables and figures saved with them (times aside, within TOLERANCE;
    within ACROSS_KINDS when they were saved on a CPU of another kind, or on one that did not say)"""
    import nbformat
    saved = nbformat.read(ROOT/'nbs'/path, as_version=4)
    there, here = saved.metadata.get('aisaac', {}).get('outputs_from'), run_nbs.kernels()
    bad = drift(saved, rerun(path), TOLERANCE if there == here else ACROSS_KINDS)
    assert not bad, (f"{path}: the saved outputs are not what the code gives now (run scripts/run_nbs.py on it; saved on {there or 'a CPU not named'}, "
                     f"re-run on {here}):\n" + '\n'.join(f'  cell {i}: {d}' for i, d in bad))

def test_the_fast_pages_are_saved_with_one_thread():
    "So that their re-runs here (with the threads they were saved with) do not oversubscribe the 2 cores beside pytest-xdist's other worker"
    import nbformat
    threads = {p: nbformat.read(ROOT/'nbs'/p, as_version=4).metadata.get('aisaac', {}).get('threads') for p in FAST}
    assert set(run_nbs.ONE_THREAD) == set(FAST), (run_nbs.ONE_THREAD, FAST)  # run_nbs.py saves these with one thread
    assert set(threads.values()) == {'1'}, f"{threads}: save them with scripts/run_nbs.py --skip-slow " + ' '.join(f'nbs/{p}' for p in FAST)

def test_make_test_leaves_the_fast_pages_to_this_file():
    "`make test` runs nbdev-test without the pages that this file runs in a kernel and checks (FAST): KERNEL_NBS names them all, and only them"
    m = re.search(r'^KERNEL_NBS \?= \^\((.*)\)\\\.ipynb\$\$$', (ROOT/'Makefile').read_text(), re.M)
    assert m and set(m[1].split('|')) == {Path(p).stem for p in FAST}, m

def test_the_notebook_runs_leave_out_what_they_say_and_start_the_longest_first(monkeypatch):
    "`make nbtest`'s skip list is one regular expression of the groups asked for (test-fast: the long tutorials too); scripts/nbtest.py starts "
    "the longest notebooks first, and each with the warning filters it found (post_training's `filterwarnings('ignore')` made 34_sft fail after it)"
    def skipped(*flags):
        r = subprocess.run(['make', '-s', '-n', 'nbtest', *flags], capture_output=True, text=True, cwd=ROOT)
        m = re.search(r"--skip-file-re '([^']*)'", r.stdout)
        return None if m is None else {p.name for p in (ROOT/'nbs').rglob('*.ipynb') if re.search(m[1], p.name)}
    long = {'language_model.ipynb', 'fine_tuning.ipynb', 'post_training.ipynb', 'vision.ipynb'}
    kernel = {Path(p).name for p in FAST}
    assert skipped() is None
    assert skipped('SKIP_KERNEL_NBS=1') == kernel
    assert skipped('SKIP_KERNEL_NBS=1', 'SKIP_LONG_NBS=1') == kernel | long
    spec = importlib.util.spec_from_file_location('nbtest', ROOT/'scripts'/'nbtest.py')
    nbtest = importlib.util.module_from_spec(spec); spec.loader.exec_module(nbtest)
    nbs = sorted((ROOT/'nbs').rglob('*.ipynb'))
    assert {n for n in nbtest.FIRST} <= {p.name for p in nbs}, nbtest.FIRST  # each one it names is there
    order = [p.name for p in nbtest.longest_first(nbs)]
    assert order[:len(nbtest.FIRST)] == nbtest.FIRST and sorted(order) == sorted(p.name for p in nbs)
    import nbdev.test, warnings
    for name in ('sorted', 'test_nb'): monkeypatch.setattr(nbdev.test, name, getattr(nbdev.test, name, None), raising=False)  # put back after
    nbtest.install()
    assert [p.name for p in nbdev.test.sorted(nbs)] == order and nbdev.test.test_nb is nbtest.isolated_test_nb
    assert nbdev.test.sorted([3, 1, 2], key=lambda x: -x) == [3, 2, 1]  # nbdev's other call of `sorted` (its timings) as the builtin
    def notebook(fn): warnings.filterwarnings('ignore', message='a notebook silenced this'); return True, 0
    monkeypatch.setattr(nbtest, '_test_nb', notebook)
    before = list(warnings.filters)
    assert nbtest.isolated_test_nb('x.ipynb') == (True, 0) and warnings.filters == before
