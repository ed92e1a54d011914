"""Every export is documented: a docstring, its parameters (docments), and an entry on the docs site.

The rules and the walk are in scripts/doc_coverage.py, which also lists the problems and adds missing
`show_doc` cells (`--fix`)."""
import importlib.util, inspect, json, re
from pathlib import Path

import pytest, yaml

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location('doc_coverage', ROOT/'scripts'/'doc_coverage.py')
dc = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(dc)

def test_every_export_is_documented():
    probs = dc.problems()
    if probs: pytest.fail(f"{len(probs)} documentation problem(s):\n  " + '\n  '.join(dc.report(probs)), pytrace=False)

def test_the_walk_sees_what_it_must():
    "The walk finds methods, properties and patched methods, and the site entries come from the notebooks"
    names = {q for q, *_ in dc.exports()}
    assert {'Trainer', 'Trainer.fit', 'Trainer.training', 'CallbackMixin.run_callbacks', 'Overview.summarize_callbacks',
            'DataLoaders.from_dataset_dict', 'BasicTrainCB.predict'} <= names
    assert 'torch' not in names and 'MulticlassAccuracy' not in names  # re-exports are not ours
    shown, where = dc.site_entries()
    assert {'Trainer', 'Overview.summarize_callbacks', 'DataLoaders.from_dataset_dict', 'Trainer.fit'} <= shown
    assert where['Trainer'] == 'nbs/27_trainer.ipynb' and where['MetricsCB'] == 'nbs/callbacks/41_metrics.ipynb'

def test_a_gap_is_reported(monkeypatch):
    "A missing docstring, an undocumented parameter and a missing show_doc are each named, with the notebook"
    import aisaac.trainer as tr
    def shiny(self, n): return n
    shiny.__module__ = 'aisaac.trainer'  # as if the notebook had defined it in the class
    monkeypatch.setattr(tr.Trainer, 'shiny', shiny, raising=False)
    bad = [(nb, what) for nb, q, what, _ in dc.problems() if q == 'Trainer.shiny']
    assert bad == [('nbs/27_trainer.ipynb', 'docstring'), ('nbs/27_trainer.ipynb', 'params'), ('nbs/27_trainer.ipynb', 'entry')]
    # a callback hook's `trainer` needs no docment, its other parameters do
    from aisaac.callbacks.train import DeviceCB
    def after_loss(self, trainer, scale): "Scale"
    after_loss.__module__ = 'aisaac.callbacks.train'
    monkeypatch.setattr(DeviceCB, 'after_loss', after_loss, raising=False)
    msgs = [m for _, q, w, m in dc.problems() if q == 'DeviceCB.after_loss' and w == 'params']
    assert len(msgs) == 1 and "['scale']" in msgs[0], msgs

_dspec = importlib.util.spec_from_file_location('docs_site', ROOT/'scripts'/'docs.py')
docs_site = importlib.util.module_from_spec(_dspec); _dspec.loader.exec_module(docs_site)

def test_notebooks_that_show_something_are_saved_with_outputs():
    "What the docs pages show: every notebook with a cell that prints, plots or shows something carries outputs (`make docs`)"
    bad = [f"{nb}: {p}" for nb in docs_site.notebooks() for p in docs_site.check_saved_outputs(nb)]
    assert not bad, '\n'.join(bad)

def test_a_notebook_saved_without_outputs_is_reported(tmp_path, monkeypatch):
    "The check names the notebook, the cell and the command that saves its outputs; show_doc cells and bare tests do not count"
    code = lambda src: {'cell_type': 'code', 'source': src, 'outputs': [], 'metadata': {}, 'execution_count': None}
    nb = {'cells': [code('show_doc(Trainer)'), code('test_eq(1, 1)'), code('def f(): print(1)'), code('ax = plot_func(torch.tanh)\ntest_eq(1, 1)')]}
    (tmp_path/'x.ipynb').write_text(json.dumps(nb))
    monkeypatch.setattr(docs_site, 'NBS', tmp_path)
    assert docs_site.check_saved_outputs('x.ipynb') == [
        "saved without outputs, though cell 3 shows something (`ax = plot_func(torch.tanh)`), so its page shows none: "
        "run `make docs NBS=nbs/x.ipynb` to execute it and save its outputs"]
    nb['cells'].pop()
    (tmp_path/'x.ipynb').write_text(json.dumps(nb))
    assert docs_site.check_saved_outputs('x.ipynb') == []

def _sections(nb_path):
    "The `### ` sections of a notebook's markdown, as {heading: text}"
    md = '\n\n'.join(''.join(c['source']) for c in json.loads(nb_path.read_text())['cells'] if c['cell_type'] == 'markdown')
    return {s.split('\n', 1)[0]: s for s in md.split('\n### ')[1:]}

def test_aisaac_guide_says_there_is_no_trainer_batches_and_what_to_use():
    "The AIsaac guide's differences: AIsaac's `trainer.batches` is not offered, and what replaces it"
    from tiny import make_trainer
    secs = [s for s in _sections(ROOT/'nbs'/'guides'/'coming_from_aisaac.ipynb').values() if '`trainer.batches`' in s.split('\n', 1)[0]]
    assert len(secs) == 1, 'no section on `trainer.batches` in the list of differences'
    for name in ('`trainer.batch_num`', '`len(trainer.dl)`', '`trainer.clock`'): assert name in secs[0], name
    assert not hasattr(make_trainer(), 'batches')  # what the guide says

def test_aisaac_guide_names_onebatchcbs_rows_in_summarize_callbacks():
    "The AIsaac guide's section on `summarize_callbacks` names each event at which `OneBatchCB` has a row"
    from tiny import make_trainer
    from aisaac.callbacks.train import OneBatchCB
    t = make_trainer([OneBatchCB()])
    events = [ev for ev, cb, *_ in t.summarize_callbacks() if cb == 'OneBatchCB']
    assert len(events) > 1  # more than AIsaac's single `after_batch` row
    sec = _sections(ROOT/'nbs'/'guides'/'coming_from_aisaac.ipynb')['`summarize_callbacks` returns a table of its own']
    assert 'OneBatchCB' in sec and all(f'`{ev}`' in sec for ev in events), events

# ---------------------------------------------------------------- what the site shows of the kernel

def test_the_loop_in_events_docstring_is_drawn_as_a_block():
    "`event`'s docstring, 'the one picture to keep in mind', is a code block in `show_doc` (else Markdown makes it one paragraph)"
    from nbdev.showdoc import BasicMarkdownRenderer
    from aisaac.core.callback import event
    md = BasicMarkdownRenderer(event)._repr_markdown_()
    assert re.search(r'\n```\nTrainer\(\.\.\.\) +after_create\nfit\(n_epochs, lr\) +before_fit\n', md), md

def _outputs(nb):
    "The Markdown and text outputs of a saved notebook, joined"
    cells = json.loads((ROOT/'nbs'/nb).read_text())['cells']
    return '\n'.join(''.join(o.get('data', {}).get('text/markdown', o.get('data', {}).get('text/plain', o.get('text', ''))))
                     for c in cells for o in c.get('outputs', []))

def test_callbacks_settings_are_shown_as_a_table():
    "The point of `Callback`: each setting, its default and its meaning, in a table made from the class (the comment beside each)"
    from aisaac.core.callback import Callback
    src, out = inspect.getsource(Callback), _outputs('core/00_callback.ipynb')
    settings = [k for k, v in vars(Callback).items() if not k.startswith('_') and not callable(v)]
    assert len(settings) == 11, settings
    for k in settings:
        comment = re.search(rf'\b{k} = .*?# (.+)$', src, re.M).group(1)
        assert re.search(rf'^\| [^|]*`{k}`[^|]* \| `{re.escape(repr(getattr(Callback, k)))}` \| {re.escape(comment)} \|$', out, re.M), k

def test_every_entry_is_documented_once():
    "One entry per object on the site: nbdev adds a `show_doc` for each definition of an exported cell (a `@patch`ed method even when a cell shows it already)"
    dups = [f"{nb}: {name}" + (f" (also on {', '.join(others)})" if others else " (twice)") for nb, name, others in dc.duplicate_entries()]
    assert not dups, f"{len(dups)} entries documented more than once:\n  " + '\n  '.join(dups)

def test_links_inside_links_are_unnested():
    "nbdev links a backticked name inside a link's text too; pandoc then shows the inner link as text: the docs keep the outer one"
    md = "| [[`Plans`](plans.html#plans)](plans.html) | see [the [`Trainer`](t.html#trainer) and [`fit`](t.html#fit)](t.html) |"
    assert docs_site.unnest_links(md) == "| [`Plans`](plans.html) | see [the `Trainer` and `fit`](t.html) |"
    kept = "[![badge](b.svg)](x.html) and [a](b)\n```\n[[`x`](y)](z)\n```"
    assert docs_site.unnest_links(kept) == kept  # images in links, and code, are left alone

def test_a_link_left_as_text_is_reported(tmp_path, monkeypatch):
    (tmp_path/'p.html').write_text('<p>[<code>Plans</code>](plans.html#plans) and <a href="x.html">x</a></p>'
                                   '<pre>a[0](1)</pre><p>write <code>[text](url)</code></p>')
    monkeypatch.setattr(docs_site, 'DOCS', tmp_path)
    assert docs_site.check_raw_links() == ["p.html: a link shown as text, not rendered: '[Plans](plans.html#plans)'"]

def test_a_class_is_shown_as_a_class_with_its_real_signature():
    "fastcore's `show_doc` writes `def Callback(*args, **kwargs)` for a class without an `__init__`; the docs write what Python knows"
    from nbdev.showdoc import BasicMarkdownRenderer
    from aisaac.core.callback import Callback
    from aisaac.core.trainer import Trainer
    md = docs_site.class_signature(BasicMarkdownRenderer(Callback)._repr_markdown_())
    assert "```python\nclass Callback()\n```" in md, md
    md = docs_site.class_signature(BasicMarkdownRenderer(Trainer)._repr_markdown_())
    assert "```python\nclass Trainer(\n    dls, # an object with `train` and `valid` loaders" in md, md
    from aisaac.core.dispatch import CallbackMixin
    md = docs_site.class_signature(BasicMarkdownRenderer(CallbackMixin)._repr_markdown_())
    assert "```python\nclass CallbackMixin()\n```" in md, md  # its `__new__(cls, *args, **kwargs)` passes on a subclass's arguments
    fit = BasicMarkdownRenderer(Trainer.fit)._repr_markdown_()
    assert docs_site.class_signature(fit) == fit.replace('callbacks:NoneType=None', 'callbacks=None')  # a method stays a `def`, its annotations readable

def test_a_kernel_cell_whose_code_is_not_on_its_page_is_reported(tmp_path, monkeypatch):
    "The docs check reads each page of the kernel for the code of every exported cell of its notebook"
    (tmp_path/'core').mkdir()
    (tmp_path/'core'/'callback.html').write_text('<h3>event</h3><pre><code>class event()</code></pre>')
    monkeypatch.setattr(docs_site, 'DOCS', tmp_path)
    bad = docs_site.check_kernel_code({'core/00_callback.ipynb': {'output-file': 'callback.html'}})
    assert len(bad) == 3 and bad[0].startswith('core/00_callback.ipynb: cell 4 is exported but its code is not on its page'), bad

def test_the_reference_lists_every_event():
    "The reference page's table of events is made from `Trainer.events`: every event has a row, and a new one cannot be left out"
    from aisaac.trainer import Trainer
    from aisaac.core.callback import event
    nb = json.loads((ROOT/'nbs'/'guides'/'reference.ipynb').read_text())
    shown = '\n'.join(''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'markdown') + '\n' + _outputs('guides/reference.ipynb')
    rows = re.search(r'^\| event \|.*\n(?:\|.*\n?)*', shown, re.M).group(0).splitlines()[2:]
    missing = [e for e in Trainer.events if not any(re.search(rf'`{e}`', r.split('|')[1]) for r in rows)]
    assert not missing, f"{len(missing)} of the {len(Trainer.events)} events have no row on the reference page: {missing}"
    kernel = [e for e in event.names if not any(f'**`{e}`**' in r.split('|')[1] for r in rows)]
    assert not kernel, f"kernel events not marked: {kernel}"
    ns, code = {}, [''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'code']
    exec(code[0], ns)  # the notebook's imports
    exec(next(c for c in code if 'def _events_table' in c), ns)
    with pytest.raises(ValueError, match=r"events without a row here: \['before_new_thing'\]"):
        ns['_events_table'](Trainer.events + ('before_new_thing',))

def test_the_cells_the_docs_build_runs_need_only_cells_it_runs():
    "nbdev's processing runs exported cells, `show_doc` and every cell with an import, no other: none of those may read a name only another cell makes (CI's docs check failed so: `NameError: name 'dls' is not defined`)"
    probs = dc.docs_run_problems()
    assert not probs, '\n'.join(f"{nb} cell {i} reads {', '.join(names)}, which the docs build never defines: "
                                 f"put the cell's imports in a cell of their own" for nb, i, names in probs)

def test_a_cell_the_docs_build_cannot_run_is_reported(tmp_path):
    "A cell with an import that reads a name from a cell without one is found; the imports moved to a cell of their own, it is not"
    def nb(*cells): return {'cells': [{'cell_type': 'code', 'metadata': {}, 'outputs': [], 'execution_count': None, 'source': s} for s in cells],
                            'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}
    bad, good = tmp_path/'bad.ipynb', tmp_path/'good.ipynb'
    bad.write_text(json.dumps(nb('x = 1', 'import math\nprint(math.pi + x)', 'def f(y): return y', 'import torch\ndl = torch.utils.data.DataLoader([1], num_workers=2)')))
    good.write_text(json.dumps(nb('x = 1', 'import math', 'print(math.pi + x)', '#| export\ndef g(): return later()')))
    assert dc.docs_run_problems([bad, good]) == [(str(bad), 1, ['x']), (str(bad), 3, ['(worker processes: num_workers)'])]

# ---------------------------------------------------------------- what a reader sees at 1280 px (headless Chromium)

needs_chromium = pytest.mark.skipif(docs_site.chromium() is None, reason='no chromium on PATH (`apt-get install chromium`)')

def _page(tmp_path, name, code, style=''):
    "A page like the site's (its CSS), with one code block"
    import shutil
    shutil.copy(docs_site.SITE/'site.css', tmp_path/'site.css')
    (tmp_path/name).write_text(f'<!DOCTYPE html><html><head><link rel="stylesheet" href="site.css"><style>{style}</style></head>'
                               f'<body><div class="layout"><nav class="sidebar">x</nav><main><div class="sourceCode" id="cb1">'
                               f'<pre class="sourceCode python"><code class="sourceCode python">{code}</code></pre></div></main></div></body></html>')

@needs_chromium
def test_a_cut_code_block_is_reported_and_a_wrapped_one_is_not(tmp_path):
    "The docs check measures each code block's widest line against its box at 1280 px: cut fails, wrapped beyond 120 passes, 120 fit"
    line = 'x = ' + ', '.join(f'value_{i}' for i in range(30))  # 292 characters
    _page(tmp_path, 'cut.html', line, style='main pre > code.sourceCode, main pre { white-space: pre !important; overflow-x: hidden; }')
    _page(tmp_path, 'wrapped.html', line)
    _page(tmp_path, 'kernel.html', 'y' * 120)
    _page(tmp_path, 'narrow.html', 'y' * 120, style='main { max-width: 700px; }')
    res = docs_site.in_chromium(['cut.html', 'wrapped.html', 'kernel.html', 'narrow.html'], root=tmp_path)
    assert set(res) == {'cut.html', 'narrow.html'}, res
    assert res['cut.html'][0].startswith('code block 0 (cb1) is cut at 1280 px: its widest line has 292 characters, its box shows 12'), res
    assert 'wraps a line of 120 characters' in res['narrow.html'][0], res

@needs_chromium
def test_typing_a_callbacks_name_in_the_search_box_finds_its_page(tmp_path, monkeypatch):
    "`make site` writes search_index.js from every page; the box (scripts/site/search.js) finds a callback's page, at its entry"
    import shutil
    monkeypatch.setattr(docs_site, 'DOCS', tmp_path)
    body = lambda main: (f'<!DOCTYPE html><html><body data-root="{{root}}"><header><input id="search-box"><span id="search-results" hidden></span></header>'
                         f'<main>{main}</main><script src="{{root}}search.js"></script></body></html>')
    (tmp_path/'callbacks').mkdir()
    (tmp_path/'index.html').write_text(body('<h1 id="aisaac">aisaac</h1><p>A trainer.</p>').replace('{root}', ''))
    (tmp_path/'callbacks'/'metrics.html').write_text(body('<h3 id="metricscb">MetricsCB</h3><p>the losses and metrics</p>').replace('{root}', '../'))
    (tmp_path/'callbacks'/'progress.html').write_text(body('<h3 id="progresscb">ProgressCB</h3><p>a bar</p>').replace('{root}', '../'))
    shutil.copy(docs_site.SITE/'search.js', tmp_path/'search.js')
    pages = {'index.ipynb': {'title': 'aisaac'}, 'callbacks/41_metrics.ipynb': {'title': 'Metrics', 'output-file': 'metrics.html'},
             'callbacks/42_progress.ipynb': {'title': 'Progress', 'output-file': 'progress.html'}}
    docs_site.write_search_index(pages, list(pages))
    _, found = docs_site.in_chromium(['index.html'], root=tmp_path, search='MetricsCB')
    assert found == ['callbacks/metrics.html#metricscb'], found
    _, found = docs_site.in_chromium(['index.html'], root=tmp_path, search='NoSuchCallbackCB')
    assert found == [], found
    (tmp_path/'search_index.js').unlink()  # without the index (a site built before the search), nothing is found
    _, found = docs_site.in_chromium(['index.html'], root=tmp_path, search='MetricsCB')
    assert found == [], found

def test_a_temporary_path_or_a_warnings_source_line_in_an_output_is_reported(tmp_path, monkeypatch):
    "The docs check refuses `/tmp/tmpXXXX/...` and `file:line: UserWarning` + source line in saved outputs; run_nbs saves them as `<tmp>` and `UserWarning: ...`"
    import importlib.util, nbformat
    spec = importlib.util.spec_from_file_location('run_nbs', ROOT/'scripts'/'run_nbs.py')
    run_nbs = importlib.util.module_from_spec(spec); spec.loader.exec_module(run_nbs)
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell('sh', outputs=[nbformat.v4.new_output('execute_result', data={'text/plain': "TokenShards('/tmp/tmp_n89__8d/corpus': 4 shards)"})]),
        nbformat.v4.new_code_cell('x', outputs=[nbformat.v4.new_output('stream', name='stderr', text=
            "aisaac/sft.py:174: UserWarning: 70 of 24000 examples have more than 129 tokens\n  if why: warnings.warn('; '.join(why))\n")]),
        nbformat.v4.new_code_cell('y', outputs=[nbformat.v4.new_output('stream', name='stdout', text='saved to ckpt/checkpoint_0001.pt\n')])])
    monkeypatch.setattr(docs_site, 'NBS', tmp_path)
    nbformat.write(nb, tmp_path/'x.ipynb')
    bad = docs_site.check_clean_outputs('x.ipynb')
    assert len(bad) == 2 and bad[0].startswith("cell 0: a temporary path in its output ('/tmp/tmp_n89__8d/corpus')"), bad
    assert bad[1].startswith("cell 1: a warning with its file and line ('aisaac/sft.py:174: UserWarning: 70 of 24000"), bad
    nbformat.write(run_nbs.sanitise(nb), tmp_path/'x.ipynb')  # as scripts/run_nbs.py saves a page
    assert docs_site.check_clean_outputs('x.ipynb') == []
    outs = [o for c in nbformat.read(tmp_path/'x.ipynb', as_version=4).cells for o in c.outputs]
    assert outs[0]['data']['text/plain'] == "TokenShards('<tmp>/corpus': 4 shards)"
    assert outs[1]['text'] == 'UserWarning: 70 of 24000 examples have more than 129 tokens\n'
    assert outs[2]['text'] == 'saved to ckpt/checkpoint_0001.pt\n'

def test_signatures_read_as_the_user_writes_them():
    "show_doc's signatures on the site: a property as a property, `=None` without `NoneType`, `nn.Module` without its module path"
    from nbdev.showdoc import BasicMarkdownRenderer
    from aisaac.core.trainer import Trainer
    raw = BasicMarkdownRenderer(Trainer.training)._repr_markdown_()
    assert 'def training():' in raw  # what fastcore writes
    assert "```python\n@property\nTrainer.training\n```" in docs_site.class_signature(raw), docs_site.class_signature(raw)
    fit = docs_site.class_signature(BasicMarkdownRenderer(Trainer.fit)._repr_markdown_())
    assert 'NoneType' not in fit and '    callbacks=None, # callbacks for this fit only' in fit and 'def fit(' in fit, fit
    assert docs_site.readable_params('model:torch.nn.modules.module.Module, cbs:NoneType=None') == 'model:nn.Module, cbs=None'

def test_the_pages_hide_the_imports_that_document_and_test_them(tmp_path, monkeypatch):
    "As nbdev's template hides `from nbdev.showdoc import *`: those lines are not shown, the cell's other code is"
    cell = lambda src: {'cell_type': 'code', 'source': src, 'outputs': [], 'metadata': {}, 'execution_count': None}
    nb = {'cells': [cell('from nbdev.showdoc import show_doc\nfrom fastcore.test import *'), cell('import torch\nfrom fastcore.test import test_eq\nx = 1')],
          'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}
    (tmp_path/'x.ipynb').write_text(json.dumps(nb))
    monkeypatch.setattr(docs_site, 'PROC', tmp_path)
    md, _ = docs_site.notebook_md('x.ipynb', {'x.ipynb': {}}, '')
    assert 'showdoc' not in md and 'fastcore' not in md and '```python\nimport torch\nx = 1\n```' in md, md

def test_an_entry_named_as_its_section_is_listed_once_in_the_contents():
    "`## RanksCB` then the entry `### RanksCB`: the contents list the name once (pandoc's `.unlisted`); another entry stays listed"
    entry = '---\n\n[source](x.py#L1)\n\n### RanksCB\n\n```python\nclass RanksCB()\n```'
    assert '### RanksCB {.unlisted}\n' in docs_site.unlist_repeated(entry, ['## `RanksCB`\n\nText.'])
    assert docs_site.unlist_repeated(entry, ['## Stopping together']) == entry
    assert docs_site.unlist_repeated(entry.replace('RanksCB', 'RanksCB.before_fit'), ['## `RanksCB`']) == entry.replace('RanksCB', 'RanksCB.before_fit')

def test_bare_exception_entries_become_one_table_and_a_diagram_is_drawn_once():
    "Six `Cancel*Exception` entries with a line of docstring each: one table, the anchors kept; `event`'s drawing shown by its source only"
    entry = lambda n, doc: f'---\n\n[source](x.py#L1){{target="_blank"}}\n\n### {n}\n\n```python\nclass {n}(*args)\n```\n\n*{doc}*'
    parts = ['## Cancelling', entry('CancelA', 'End a'), entry('CancelB', 'End b'), entry('CancelC', 'End c'), '## Next']
    out = docs_site.exceptions_table(parts)
    assert out == ['## Cancelling', '| exception | what raising it does |\n|---|---|\n| []{#cancela}`CancelA` | End a |\n'
                   '| []{#cancelb}`CancelB` | End b |\n| []{#cancelc}`CancelC` | End c |', '## Next'], out
    assert docs_site.exceptions_table(parts[:3] + parts[4:]) == parts[:3] + parts[4:]  # two stay entries
    drawing = 'fit    before_fit\n  epoch    before_epoch\n    batch    before_batch\n    after_batch'
    doc = f'---\n\n[source](x.py#L1)\n\n### event\n\n```python\nclass event()\n```\n\n*The events:*\n\n```\n{drawing}\n```\nA note.'
    src = '<details open>\n\n```python\nclass event:\n    """The events:\n' + ''.join(f'    {l}\n' for l in drawing.split('\n')) + '"""\n```'
    shown = docs_site.one_diagram([doc, src])[0]
    assert 'before_epoch' not in shown and 'class event()' in shown and 'A note.' in shown, shown
    assert docs_site.one_diagram([doc, '## Other'])[0] == doc  # not in the source next to it: kept

def test_event_handlers_are_listed_under_their_callback_not_as_entries():
    "`CheckpointCB.before_fit` and the like (the trainer only, one line): a table under the callback, anchors kept; a handler with more to say stays an entry"
    h = lambda cls, name, doc, params='\n    trainer\n': (f'---\n\n[source](x.py#L1){{target="_blank"}}\n\n### {cls}.{name}\n\n'
                                                         f'```python\ndef {name}({params}):\n```\n\n*{doc}*')
    parts = ['### CheckpointCB', h('CheckpointCB', 'before_fit', 'Count `every`'), h('CheckpointCB', 'after_batch', 'Save'),
             h('RanksCB', 'after_fit', 'Agree'), h('RanksCB', 'after_loss', 'Scale', '\n    trainer, # the trainer\n    scale:float, # how much\n'), '## Next']
    out = docs_site.handlers_table(parts)
    assert out[1] == ('| `CheckpointCB` at | what it does |\n|---|---|\n| []{#checkpointcb.before_fit}`before_fit` | Count `every` |\n'
                      '| []{#checkpointcb.after_batch}`after_batch` | Save |'), out[1]
    assert out[2] == '| `RanksCB` at | what it does |\n|---|---|\n| []{#rankscb.after_fit}`after_fit` | Agree |', out[2]
    assert out[3] == parts[4] and out[4] == '## Next' and len(out) == 5, out

def test_tables_size_their_columns_and_keep_the_first_columns_names_whole():
    "pandoc's equal fixed widths (7 x 14 % on the reference page) dropped; names break at `_` except in the first column"
    t = ('<table style="width:100%;">\n<colgroup>\n<col style="width: 50%" />\n<col style="width: 50%" />\n</colgroup>\n'
         '<tr class="odd">\n<td><code>before_fit</code></td>\n<td><code>on_fit_start</code></td>\n</tr>\n</table>')
    assert docs_site._table_breaks(t) == ('<table>\n<tr class="odd">\n<td><code>before_fit</code></td>\n'
                                          '<td><code>on_<wbr>fit_<wbr>start</code></td>\n</tr>\n</table>')

def test_the_sidebar_names_a_page_by_its_title_up_to_a_colon():
    "Long titles took three lines of the sidebar (`Transfer learning: a pretrained body for a few hundred images`): the part before the colon"
    assert docs_site.sidebar_label('Transfer learning: a pretrained body for a few hundred images') == 'Transfer learning'
    assert docs_site.sidebar_label('Callbacks') == 'Callbacks'
    groups, _ = docs_site.sidebar_groups()
    assert list(groups)[:2] == ['Tutorials', 'The kernel'] and groups['Tutorials'][0] == 'tutorials/callbacks.ipynb', list(groups)
    docs_site.write_sidebar()
    side = yaml.safe_load((docs_site.NBS/'sidebar.yml').read_text())['website']['sidebar']['contents']
    assert {'href': 'tutorials/vision.ipynb', 'text': 'Vision'} in side[1]['contents'], side[1]

def test_no_page_shows_the_doc_and_test_tools_imports():
    "nbdev's convention (issue 50 item 5): a cell that only imports `nbdev.showdoc` and `fastcore.test` is hidden (`#| hide`); it still runs under nbdev-test. (Such imports inside a cell with other imports are shown still: moving them would shift the cells that tests count)"
    noise = re.compile(r'^(from nbdev\.showdoc import .*|from fastcore\.test import .*)$')
    shown = []
    for p in sorted((ROOT/'nbs').rglob('*.ipynb')):
        for i, c in enumerate(json.loads(p.read_text())['cells']):
            lines = [l for l in ''.join(c['source']).splitlines() if l.strip()]
            if c['cell_type'] != 'code' or any(l.startswith('#|') and 'hide' in l for l in lines): continue
            code = [l for l in lines if not l.startswith('#')]
            if code and all(noise.match(l) for l in code): shown.append(f"{p.relative_to(ROOT)} cell {i}")
    assert not shown, f"{len(shown)} cells that only import the doc and test tools show on the site: mark them `#| hide`: {shown[:10]}"

def test_a_cell_of_assertions_alone_is_folded_under_checks_and_others_are_not(tmp_path, monkeypatch):
    "A cell of `test_eq`/`assert` alone, without outputs, is folded (Quarto's `code-fold`, summary Checks); a cell that also makes something, or shows an output, is not"
    cell = lambda src, outs=(): {'cell_type': 'code', 'source': src, 'outputs': list(outs), 'metadata': {}, 'execution_count': None, 'id': None}
    out = {'output_type': 'stream', 'name': 'stdout', 'text': '1\n'}
    nb = {'cells': [cell('test_eq(1, 1)\nassert 2 > 1'), cell('x = 1\ntest_eq(x, 1)'), cell('test_eq(1, 1)\nprint(1)', [out]), cell('#| eval: false\ntest_eq(1, 1)')],
          'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}
    (tmp_path/'x.ipynb').write_text(json.dumps(nb))
    monkeypatch.setattr(docs_site, 'PROC', tmp_path)
    monkeypatch.setattr(docs_site, 'NBS', tmp_path/'none')
    docs_site.fix_processed('x.ipynb')
    md, _ = docs_site.notebook_md('x.ipynb', {'x.ipynb': {}}, '')
    assert md.count('<summary>Checks</summary>') == 1 and '<details>\n<summary>Checks</summary>\n\n```python\ntest_eq(1, 1)\nassert 2 > 1\n```' in md, md
    assert '```python\nx = 1\ntest_eq(x, 1)\n```' in md and '```python\ntest_eq(1, 1)\nprint(1)\n```' in md
