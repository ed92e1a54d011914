"""Every export is documented: a docstring, its parameters (docments), and an entry on the docs site.

The rules and the walk are in scripts/doc_coverage.py, which also lists the problems and adds missing
`show_doc` cells (`--fix`)."""
import importlib.util, json
from pathlib import Path

import pytest

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
