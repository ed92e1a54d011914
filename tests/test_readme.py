"""The README says what is true: its notebook table lists every notebook (and no other), each with the module it exports;
the extras it says `make setup` installs are the Makefile's `EXTRAS`; every extra of pyproject.toml is described; and it
holds the same text as nbs/index.ipynb (`make readme` writes it)."""
import fnmatch, importlib.util, json, re, tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT/'nbs'
_spec = importlib.util.spec_from_file_location('readme_sync', ROOT/'scripts'/'readme_sync.py')
readme_sync = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(readme_sync)
README = (ROOT/'README.md').read_text()

def notebooks():
    "Every page of the docs but the home page, as the table names them: `30_data`, `callbacks/40_train`, `tutorials/vision`"
    return sorted(p.relative_to(NBS).with_suffix('').as_posix() for p in NBS.rglob('*.ipynb')
                  if p.name != 'index.ipynb' and not any(part.startswith(('_', '.')) for part in p.relative_to(NBS).parts))

def table(text=README):
    "The rows of the README's notebook table: {notebook or pattern: module or ''}"
    return {m[1]: m[2] for m in re.finditer(r'^\| `([\w/*]+)` \| (?:`([\w.]+)`)? *\|', text, re.M)}

def exported_module(nb):
    "The module a notebook exports (`#| default_exp`), as `aisaac.x`; None for a page without one"
    src = '\n'.join(''.join(c['source']) for c in json.loads((NBS/f'{nb}.ipynb').read_text())['cells'] if c['cell_type'] == 'code')
    return f'aisaac.{m[1]}' if (m := re.search(r'^#\|\s*default_exp\s+(\S+)', src, re.M)) else None

def test_the_table_lists_every_notebook_and_nothing_else():
    rows, nbs = table(), notebooks()
    assert len(rows) > 40, 'the notebook table was not found in README.md'
    missing = [nb for nb in nbs if not any(fnmatch.fnmatch(nb, r) for r in rows)]
    stale = [r for r in rows if not any(fnmatch.fnmatch(nb, r) for nb in nbs)]
    assert not missing, f"README.md's table leaves out {missing}: add a row for each (edit nbs/index.ipynb, then `make readme`)"
    assert not stale, f"README.md's table lists {stale}, which are not notebooks in nbs/"

def test_each_row_names_the_module_its_notebook_exports():
    rows = table()
    wrong = {r: (m, exported_module(r)) for r, m in rows.items() if '*' not in r and (m or None) != exported_module(r)}
    assert not wrong, f"rows whose module (README, notebook) differ: {wrong}"
    assert {'aisaac.sft', 'aisaac.hf'} <= set(rows.values())

def test_the_default_extras_are_the_makefiles():
    make = re.search(r'^EXTRAS\s*\?=\s*(\S+)', (ROOT/'Makefile').read_text(), re.M)[1]
    said = re.search(r'\(`EXTRAS`, default `([^`]+)`\)', README)
    assert said, "README.md no longer says which extras `make setup` installs (`EXTRAS`, default `...`)"
    assert said[1] == make, f"README.md says the default extras are {said[1]}, the Makefile installs {make}"

def test_every_extra_is_described():
    extras = tomllib.loads((ROOT/'pyproject.toml').read_text())['project']['optional-dependencies']
    install = README.split('## Install', 1)[1].split('\n## ', 1)[0]
    missing = [e for e in extras if f'`{e}`' not in install and f'".[{e}]"' not in install]
    assert not missing, f"the Install section of README.md does not describe the extras {missing}"

def test_readme_is_the_home_page():
    assert README == readme_sync.readme_text(NBS/'index.ipynb'), 'README.md differs from nbs/index.ipynb: edit the notebook, then `make readme`'

def test_a_missing_notebook_or_a_stale_row_fails():
    "The check itself: a notebook added without a row, and a row without a notebook, are both found"
    rows = table()
    assert not any(fnmatch.fnmatch('35_new_layer', r) for r in rows)
    assert table('| `35_new_layer` | `aisaac.new` | x |\n') == {'35_new_layer': 'aisaac.new'}
