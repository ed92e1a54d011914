"""The README and CONTRIBUTING.md say what is true: the notebook table ("Where things are", on the contributing page)
lists every notebook (and no other), each with the module it exports; the extras it says `make setup` installs are the
Makefile's `EXTRAS`; every extra of pyproject.toml is described; README.md holds the same text as nbs/index.ipynb and
CONTRIBUTING.md as nbs/guides/contributing.ipynb (`make readme` writes both), and the README links the contributing page."""
import fnmatch, importlib.util, json, re, tomllib

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT/'nbs'
_spec = importlib.util.spec_from_file_location('readme_sync', ROOT/'scripts'/'readme_sync.py')
readme_sync = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(readme_sync)
README = (ROOT/'README.md').read_text()
CONTRIBUTING = (ROOT/'CONTRIBUTING.md').read_text()
# The notebook table and the Install section live on one of the two pages (the contributing one since the home page
# became a newcomer's): the checks read them wherever they are, and fail when neither has them.
TABLE_PAGE = next((t for t in (README, CONTRIBUTING) if '\n## Where things are' in t), '')
INSTALL_PAGE = next((t for t in (README, CONTRIBUTING) if '\n## Install' in t), '')

def notebooks():
    "Every page of the docs but the home page, as the table names them: `30_data`, `callbacks/40_train`, `tutorials/vision`"
    return sorted(p.relative_to(NBS).with_suffix('').as_posix() for p in NBS.rglob('*.ipynb')
                  if p.name != 'index.ipynb' and not any(part.startswith(('_', '.')) for part in p.relative_to(NBS).parts))

def table(text=None):
    "The rows of the notebook table: {notebook or pattern: module or ''}"
    text = TABLE_PAGE if text is None else text
    return {m[1]: m[2] for m in re.finditer(r'^\| \[?`([\w/*]+)`(?:\]\([^()\s]+\))? \| (?:`([\w.]+)`)? *\|', text, re.M)}  # the name, or the name linked to its page

def exported_module(nb):
    "The module a notebook exports (`#| default_exp`), as `aisaac.x`; None for a page without one"
    src = '\n'.join(''.join(c['source']) for c in json.loads((NBS/f'{nb}.ipynb').read_text())['cells'] if c['cell_type'] == 'code')
    return f'aisaac.{m[1]}' if (m := re.search(r'^#\|\s*default_exp\s+(\S+)', src, re.M)) else None

def test_the_table_lists_every_notebook_and_nothing_else():
    rows, nbs = table(), notebooks()
    assert len(rows) > 40, 'the notebook table was found neither in README.md nor in CONTRIBUTING.md'
    missing = [nb for nb in nbs if not any(fnmatch.fnmatch(nb, r) for r in rows)]
    stale = [r for r in rows if not any(fnmatch.fnmatch(nb, r) for nb in nbs)]
    assert not missing, f"the notebook table leaves out {missing}: add a row for each (edit nbs/guides/contributing.ipynb, then `make readme`)"
    assert not stale, f"the notebook table lists {stale}, which are not notebooks in nbs/"

def test_each_row_names_the_module_its_notebook_exports():
    rows = table()
    wrong = {r: (m, exported_module(r)) for r, m in rows.items() if '*' not in r and (m or None) != exported_module(r)}
    assert not wrong, f"rows whose module (README, notebook) differ: {wrong}"
    assert {'aisaac.sft', 'aisaac.hf'} <= set(rows.values())

def test_the_default_extras_are_the_makefiles():
    make = re.search(r'^EXTRAS\s*\?=\s*(\S+)', (ROOT/'Makefile').read_text(), re.M)[1]
    said = re.search(r'\(`EXTRAS`, default `([^`]+)`\)', INSTALL_PAGE)
    assert said, "CONTRIBUTING.md no longer says which extras `make setup` installs (`EXTRAS`, default `...`)"
    assert said[1] == make, f"README.md says the default extras are {said[1]}, the Makefile installs {make}"

def test_every_extra_is_described():
    extras = tomllib.loads((ROOT/'pyproject.toml').read_text())['project']['optional-dependencies']
    assert INSTALL_PAGE, 'neither README.md nor CONTRIBUTING.md has an Install section'
    install = INSTALL_PAGE.split('## Install', 1)[1].split('\n## ', 1)[0]
    missing = [e for e in extras if f'`{e}`' not in install and f'".[{e}]"' not in install]
    assert not missing, f"the Install section of CONTRIBUTING.md does not describe the extras {missing}"

def test_readme_is_the_home_page():
    assert README == readme_sync.readme_text(NBS/'index.ipynb'), 'README.md differs from nbs/index.ipynb: edit the notebook, then `make readme`'

def test_contributing_is_its_notebook_and_the_readme_links_it():
    assert CONTRIBUTING == readme_sync.readme_text(NBS/'guides'/'contributing.ipynb'), \
        'CONTRIBUTING.md differs from nbs/guides/contributing.ipynb: edit the notebook, then `make readme`'
    assert 'guides/contributing.html' in README and 'CONTRIBUTING.md' in README, 'README.md does not link the contributing page'

def test_a_missing_notebook_or_a_stale_row_fails(monkeypatch):
    "The check itself: a notebook added without a row, and a row without a notebook, are both found, wherever the table lives"
    rows = table()
    assert not any(fnmatch.fnmatch('35_new_layer', r) for r in rows)
    assert table('| `35_new_layer` | `aisaac.new` | x |\n') == {'35_new_layer': 'aisaac.new'}
    assert table('| [`35_new_layer`](https://x.io/new.html) | `aisaac.new` | x |\n') == {'35_new_layer': 'aisaac.new'}
    import sys
    me = sys.modules[__name__]
    monkeypatch.setattr(me, 'TABLE_PAGE', TABLE_PAGE.replace('[`guides/contributing`]', '[`guides/contributin`]'))
    with pytest.raises(AssertionError, match=r"leaves out \['guides/contributing'\]"): test_the_table_lists_every_notebook_and_nothing_else()
    monkeypatch.setattr(me, 'TABLE_PAGE', '')
    with pytest.raises(AssertionError, match='found neither in README.md nor in CONTRIBUTING.md'): test_the_table_lists_every_notebook_and_nothing_else()
