#!/usr/bin/env python
"""The docs site: nbdev processes the notebooks, Quarto (or pandoc) renders them, and the result is checked.

    python scripts/docs.py check          # `make docs-check` (part of `make test`): process, render, check
    python scripts/docs.py render         # `make site`: the same, without failing, and says where the pages are
    python scripts/docs.py sidebar        # write nbs/sidebar.yml from SIDEBAR below
    python scripts/docs.py shots PAGE...  # screenshots of rendered pages (headless Chromium) in out/shots/

Processing is nbdev's (`refresh_quarto_yml` then `proc_nbs`, as `nbdev-proc-nbs` does, minus its attempt to
install Quarto; in this process rather than in nbdev's spawned workers, with pyproject.toml parsed once): `_proc/`
gets each notebook with front matter and rendered `show_doc` cells. Three things nbdev gets wrong are then put right, and one thing folded,
in `_proc/`, for either renderer: a link nbdev puts inside a link's text
(`[[`Plans`](plans.html#plans)](plans.html)`, which shows as text), a class's signature (`def Callback(*args,
**kwargs)` becomes `class Callback()`), and the order of the `show_doc` cells nbdev adds (last first); and a cell of
assertions alone (`test_eq`, `assert`), which a reader skips, is folded under "Checks" (`code-fold`). Rendering uses
Quarto (`nbdev-docs`) when `quarto` is on PATH; otherwise pandoc stands in: each processed notebook becomes
Markdown (honouring the cells' `echo`/`output`/`include`/`eval`/`code-fold` options, `text/markdown` and HTML outputs,
PNGs embedded), kept as `<page>.html.md` (what Quarto's `keep-md` keeps, and what each module's `Docs:` line
points to), then HTML with a sidebar and a table of contents. Either way `_docs/` is the site.

The check fails on
- a notebook nbdev cannot process, a page that does not render, a page without a title;
- a link or `#anchor` between pages that leads nowhere (links to the site's own URL included),
  and a module whose `Docs:` line names a page that does not exist;
- a Markdown link shown as text on a page (`[text](url)` outside code);
- an entry documented twice, on one page or on two (`scripts/doc_coverage.py`);
- a page of the kernel (`nbs/core/`) that does not show the code of each of its exported cells;
- a code block cut at 1280 px (its widest line wider than its box, in headless Chromium: scripts/site/check.js), and a
  line of at most 120 characters that has to wrap there (the column is too narrow for the kernel's lines);
- a tutorial or guide with no outputs, any notebook with a cell that should show something and shows
  nothing, and any notebook saved without outputs although one of its cells prints, plots or shows
  something (run `make docs NBS=nbs/<notebook>` to execute it and save its outputs);
- an output the site cannot show (a Jupyter widget), or an error output;
- a saved output with a temporary folder's path (`/tmp/tmpXXXX/...`) or a warning printed with its file and source line;
- a notebook that no group of SIDEBAR takes.
"""
import argparse, ast, base64, contextlib, functools, html, json, os, re, shutil, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urlsplit, unquote

import yaml

ROOT = Path(__file__).resolve().parent.parent
NBS, PROC, DOCS = ROOT/'nbs', ROOT/'_proc', ROOT/'_docs'
SITE = Path(__file__).resolve().parent/'site'  # the pandoc stand-in's template and CSS

# The sidebar's groups, in order. A notebook (path relative to nbs/) goes to the first group whose pattern
# matches; within a group, notebooks are sorted by FIRST, then by their number (the layers' order). nbdev does not
# regenerate nbs/sidebar.yml (`custom_sidebar = true` in pyproject.toml): this script writes it, and every
# docs command runs this first, so a new notebook lands in its group by its number or folder alone.
SIDEBAR = [  # in the order a reader learns: what to do first, then the loop, then where to look things up
    ('Tutorials', r'^tutorials/'),
    ('The kernel', r'^core/'),                  # the tiny trainer: its events, phases and loop, in three pages
    ('Guides',    r'^guides/|\d+_learner'),     # coming from another library (miniai's `Learner` with them), the reference
    ('Callbacks', r'^(callbacks/|9[0-8][a-z]?_)'),   # one notebook per family, then the groups (`CoreCBs`), the comparisons and the invariance harness
    ('Data',      r'^3\d_'),
    ('Inside the trainer', r'^(1\d|2\d)[a-z]?_'),  # the machinery's layers (1x), the trainer's (2x), the two assemblies
    ('Helpers',   r'^(0\d|99)_'),                # ground helpers, models, the run history, `aisaac.all`
]
# Pages that come first in their group, in this order (the rest follow by layer number, then by name).
FIRST = ['tutorials/callbacks.ipynb', 'tutorials/vision.ipynb', 'tutorials/transfer_learning.ipynb', 'tutorials/language_model.ipynb',
         'tutorials/fine_tuning.ipynb', 'tutorials/post_training.ipynb', 'tutorials/custom_callbacks.ipynb',
         'guides/reference.ipynb', 'guides/coming_from_miniai.ipynb', '32_learner.ipynb', 'guides/coming_from_aisaac.ipynb',
         'guides/coming_from_composer.ipynb', 'guides/coming_from_pytorch_accelerated.ipynb', 'guides/coming_from_cerebras.ipynb',
         'guides/coming_from_arctic_training.ipynb', 'guides/coming_from_nanogpt.ipynb', 'guides/callback_contracts_compared.ipynb',
         'guides/changelog.ipynb', 'guides/contributing.ipynb',
         '27_trainer.ipynb', '20_dispatch.ipynb']  # in "Inside the trainer", the two assemblies first: the classes you use
HOME = 'index.ipynb'

def _order(nb):
    "Sort key within a group: FIRST, then the layer number of the file name, then the path"
    m = re.match(r'(\d+)[a-z]?_', Path(nb).name)
    return (FIRST.index(nb) if nb in FIRST else len(FIRST), int(m.group(1)) if m else 10**6, nb)
OUTPUTS_REQUIRED = ('tutorials/', 'guides/')  # pages that must carry outputs at all; on every page, a cell that should show something must

def notebooks():
    "The notebooks of the site, relative to nbs/ (nbdev skips files and folders starting with `_` or `.`)"
    return sorted(p.relative_to(NBS).as_posix() for p in NBS.rglob('*.ipynb')
                  if not any(part.startswith(('_', '.')) for part in p.relative_to(NBS).parts))

def sidebar_groups():
    "{group: [notebook, ...]} and the notebooks no group takes"
    groups, lost = {name: [] for name, _ in SIDEBAR}, []
    for nb in notebooks():
        if nb == HOME: continue
        name = next((n for n, pat in SIDEBAR if re.search(pat, nb)), None)
        (groups[name] if name else lost).append(nb)
    return {k: sorted(v, key=_order) for k, v in groups.items() if v}, lost

def sidebar_label(title):
    "A page's name in the sidebar: its title up to a colon (`Vision: Fashion-MNIST past 92 %` is `Vision`), the page says the rest"
    return str(title).split(': ', 1)[0]

def nb_title(nb):
    "The `# Title` of notebook `nb` (relative to nbs/)"
    for c in cells_of(NBS/nb):
        if c['cell_type'] == 'markdown' and (m := re.match(r'#\s+(.+)', _text(c['source']).strip())): return m.group(1).strip()
    return nb

def write_sidebar():
    "Write nbs/sidebar.yml (Quarto's sidebar) from SIDEBAR; return the notebooks no group takes"
    groups, lost = sidebar_groups()
    item = lambda nb: {'href': nb, 'text': label} if (label := sidebar_label(t := nb_title(nb))) != t else nb
    contents = [HOME] + [{'section': name, 'contents': [item(nb) for nb in nbs]} for name, nbs in groups.items()]
    text = '# Written by scripts/docs.py from its SIDEBAR groups; not kept in git.\n'
    text += yaml.dump({'website': {'sidebar': {'contents': contents}}}, sort_keys=False)
    path = NBS/'sidebar.yml'
    if not path.exists() or path.read_text() != text: path.write_text(text)
    return lost

# ---------------------------------------------------------------------------------------------------------
# Processing (nbdev)

def process(force=False):
    "nbdev's docs processing into _proc/; redone for every notebook when the library changed since the last run"
    from nbdev.quarto import refresh_quarto_yml
    from nbdev.serve import proc_nbs
    lib = max(p.stat().st_mtime for p in (ROOT/'aisaac').rglob('*.py'))
    if PROC.exists() and PROC.stat().st_mtime < lib: force = True  # show_doc output comes from the modules
    stamp = PROC/'.aisaac_fixes'
    if PROC.exists() and (not stamp.exists() or stamp.read_text() != FIXES): force = True  # `fix_processed` changed: process again
    os.chdir(ROOT)
    refresh_quarto_yml()
    with _toml_read_once(), _shells_without_exit_work():
        proc_nbs(force=force, n_workers=0)  # in this process: 20-31 s for the 104 notebooks, against 70-90 s in nbdev's 2 spawned workers
    stamp.write_text(FIXES)

@contextlib.contextmanager
def _shells_without_exit_work():
    """nbdev runs each notebook's cells in an IPython shell of its own (execnb's `CaptureShell`, its history in memory), and IPython
    registers each shell's `atexit_operations`, whose reset collects garbage: 0.37 s a shell with torch loaded, 39 s at this process's
    exit for the 104 notebooks. The shells made while the notebooks are processed leave no such call (nothing of theirs is on disk)"""
    import atexit
    from execnb.shell import CaptureShell
    init = CaptureShell.__init__
    def made(self, *args, **kwargs):
        init(self, *args, **kwargs)
        atexit.unregister(self.atexit_operations)
    CaptureShell.__init__ = made
    try: yield
    finally: CaptureShell.__init__ = init

@contextlib.contextmanager
def _toml_read_once():
    """nbdev reads and parses pyproject.toml twice for every cell it processes (`get_config` in `clean_magics`: 6,948 parses, 10 s of 27):
    while the notebooks are processed, each TOML file is parsed once (again if it changes), and each reader gets its own copy"""
    import copy, nbdev.config as config
    load, cache = config._load_toml, {}
    def cached(p):
        st = Path(p).stat(); key = (str(p), st.st_mtime_ns, st.st_size)
        if key not in cache: cache[key] = load(p)
        return copy.deepcopy(cache[key])
    config._load_toml = cached
    try: yield
    finally: config._load_toml = load

FIXES = '4'  # the version of `fix_processed`: processed notebooks fixed by another are processed again

def cells_of(path):
    return json.loads(Path(path).read_text())['cells']

# What nbdev's processing gets wrong, put right in _proc/ before either renderer reads it (a processed page is not
# processed again until its notebook changes, so Quarto's `nbdev-docs` keeps these fixes).

_link = r'\[[^\[\]]*\]\([^()\s]*\)'
_nested = re.compile(rf'\[((?:[^\[\]]|{_link})*?)(?<!!)\[([^\[\]]*)\]\([^()\s]*\)((?:[^\[\]]|{_link})*)\]\(')

def unnest_links(md):
    "`[[`Plans`](plans.html#plans)](plans.html)` as `[`Plans`](plans.html)`: nbdev links a backticked name inside a link's text too"
    lines, fence = md.split('\n'), False
    for i, l in enumerate(lines):
        if l.lstrip().startswith('```'): fence = not fence
        elif not fence:
            while (new := _nested.sub(r'[\1\2\3](', l)) != l: l = new
            lines[i] = l
    return '\n'.join(lines)

_sig = re.compile(r'\[source\]\(\S+?/blob/[^/]+/(?P<path>\S+?)\.py#L\w+\)[^\n]*\n\n#{2,4} (?P<name>\S+)\n\n```python\n'
                  r'(?P<def>def )(?P<short>\w+)\((?P<params>.*?)\)(?P<end>:\n```)', re.S)

def readable_params(params):
    "A signature's annotations as the user writes them: `callbacks=None`, not `callbacks:NoneType=None`; `nn.Module`, not `torch.nn.modules.module.Module`"
    params = re.sub(r':\s*NoneType\s*=', '=', params)
    return params.replace('torch.nn.modules.module.Module', 'nn.Module').replace('torch.optim.optimizer.Optimizer', 'torch.optim.Optimizer')

def class_signature(md):
    "A class's `show_doc` as `class Callback()` (fastcore writes every signature with `def`, and `*args, **kwargs` for a class without an `__init__` of its own), a property as `@property`, and annotations as the user writes them"
    import importlib, inspect
    def fix(m):
        try: obj = functools.reduce(getattr, m['name'].split('.'), importlib.import_module(m['path'].replace('/', '.')))
        except (ImportError, AttributeError): return m.group(0)
        if isinstance(obj, property): return m.group(0)[:m.start('def') - m.start()] + f"@property\n{m['name']}" + m['end'][1:]
        if not inspect.isclass(obj): return m.group(0)[:m.start('params') - m.start()] + readable_params(m['params']) + m.group(0)[m.end('params') - m.start():]
        params = readable_params(m['params'])
        if params.split() == ['*args,', '**kwargs']:  # `object.__init__`'s: the class's real signature, where Python knows it
            try: params = str(inspect.signature(obj))[1:-1]
            except ValueError: params = '*args' if issubclass(obj, BaseException) else params  # an exception takes no keywords
            if params == '*args, **kwargs' and obj.__init__ is object.__init__: params = ''  # a mixin's `__new__` passes on what its subclass's `__init__` takes
        return m.group(0)[:m.start('def') - m.start()] + f"class {m['short']}({params})" + m['end'][1:]
    return _sig.sub(fix, md)

def fix_processed(nb):
    "Fix the processed notebook `nb` (relative to _proc/): its links, its classes' signatures, the order of the `show_doc` cells nbdev added, and its cells of assertions alone folded (`code-fold`, summary \"Checks\")"
    path = PROC/nb
    d = json.loads(path.read_text())
    if d['metadata'].get('aisaac_docs_fixed'): return  # fixed when processed; nbdev writes the file afresh when it changes
    d['metadata']['aisaac_docs_fixed'] = True
    ours = {c.get('id') for c in cells_of(NBS/nb)} if (NBS/nb).exists() else set()
    added = lambda c: c['cell_type'] == 'code' and c.get('id') not in ours and 'show_doc(' in _text(c['source'])
    cells, i = d['cells'], 0
    while i < len(cells):  # nbdev inserts the entries of a cell's definitions last first: put them back in their order
        j = i
        while j < len(cells) and added(cells[j]): j += 1
        cells[i:j], i = cells[i:j][::-1], max(j, i + 1)
    for c in cells:
        if c['cell_type'] == 'markdown': c['source'] = unnest_links(_text(c['source']))
        opts, code = directives(_text(c['source'])) if c['cell_type'] == 'code' else ({}, '')
        if code and not opts and not c.get('outputs') and only_checks(code):  # assertions alone: folded (Quarto's `code-fold`), one click away
            c['source'] = '#| code-fold: true\n#| code-summary: "Checks"\n' + _text(c['source'])
        for o in c.get('outputs', []):
            if 'text/markdown' in o.get('data', {}):
                o['data']['text/markdown'] = class_signature(unnest_links(_text(o['data']['text/markdown'])))
    path.write_text(json.dumps(d, indent=1, ensure_ascii=False))

def front_matter(cells):
    "The YAML front matter nbdev puts in the first (raw) cell of a processed notebook"
    if cells and cells[0]['cell_type'] == 'raw':
        src = ''.join(cells[0]['source']).strip()
        if src.startswith('---'): return yaml.safe_load(src.strip('-\n')) or {}
    return {}

def page_of(nb, fm):
    "The output page of notebook `nb` (relative to nbs/): its folder and front matter's `output-file`"
    return (Path(nb).parent/fm.get('output-file', Path(nb).with_suffix('.html').name)).as_posix()

# ---------------------------------------------------------------------------------------------------------
# Cells: options and outputs

_ansi = re.compile(r'\x1b\[[0-9;]*[A-Za-z]')

def directives(src):
    "The `#| key: value` options at the top of a cell, and the source without them"
    opts, lines = {}, src.splitlines()
    i = 0
    while i < len(lines) and (lines[i].startswith('#|') or not lines[i].strip()):
        if lines[i].startswith('#|'):
            k, _, v = lines[i][2:].strip().partition(':')
            opts[k.strip()] = v.strip() or 'true'
        i += 1
    return opts, '\n'.join(lines[i:]).strip('\n')

def _text(x): return ''.join(x) if isinstance(x, list) else x

def output_md(o, asis=False):
    "Markdown for one output, and a problem found in it (or None)"
    kind = o.get('output_type')
    if kind == 'stream':
        return f"```{{.output .{o.get('name', 'stdout')}}}\n{_ansi.sub('', _text(o['text'])).rstrip()}\n```", None
    if kind == 'error':
        tb = _ansi.sub('', '\n'.join(o.get('traceback', [])))
        return f"```{{.output .error}}\n{tb}\n```", f"error output: {o.get('ename')}: {o.get('evalue')}"
    data = o.get('data', {})
    if 'application/vnd.jupyter.widget-view+json' in data:
        return '', "a Jupyter widget output (the site cannot show it): display HTML instead, e.g. fastprogress's bars"
    if 'text/markdown' in data and (asis or 'text/html' not in data):  # show_doc, and tables such as `summarize_callbacks`
        md = _text(data['text/markdown'])
        return (md if asis else f"::: {{.output}}\n{md}\n:::"), None
    if 'text/html' in data:
        h, cls = _text(data['text/html']), 'output output_html'
        if '<style' in h and '.output_html ' in h:  # IPython's `Code` (`view_source_code`): pygments' rules for the classic
            # notebook's `.output_html`, and a bare `pre` rule, would restyle every output and code block of the page
            h, cls = h.replace('.output_html', '.output_code').replace('<style>pre {', '<style>.output_code pre {'), 'output output_code'
        return f"```{{=html}}\n<div class=\"{cls}\">\n{h}\n</div>\n```", None
    for mime in ('image/png', 'image/jpeg'):
        if mime in data:
            b64 = _text(data[mime]).replace('\n', '')
            return f"![](data:{mime};base64,{b64}){{.output-image}}", None
    if 'image/svg+xml' in data: return f"```{{=html}}\n{_text(data['image/svg+xml'])}\n```", None
    if 'text/plain' in data: return f"```{{.output}}\n{_ansi.sub('', _text(data['text/plain'])).rstrip()}\n```", None
    return '', None

# A cell whose last statement is one of these should show something in a tutorial or guide.
_shows = (ast.Name, ast.Attribute, ast.Subscript, ast.Compare, ast.BinOp, ast.Tuple, ast.List, ast.Dict, ast.Constant)
_show_calls = ('print', 'view_source_code', 'show_batch', 'summarize_callbacks', 'show_doc', 'display', 'plot',
               'imshow', 'show_image', 'show_images', 'plot_stats', 'color_dim', 'dead_chart', 'plot_lr_find')

def _call_name(node):
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ''

def shown_by(src):
    "The line of the code `src` that displays something, or None: its last line when it ends with an expression that shows, or a call to print, display, a show or plot function (not inside a def or class); `show_doc` aside (nbdev redoes those)"
    if should_show(src) and not src.lstrip().startswith('show_doc('): return src.strip().splitlines()[-1]
    try: tree = ast.parse(src)
    except SyntaxError: return None
    calls = (n for st in tree.body if not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(st)
             if isinstance(n, ast.Call) and _call_name(n) != 'show_doc' and (_call_name(n) in _show_calls or _call_name(n).startswith(('show_', 'plot'))))
    n = next(calls, None)
    return src.splitlines()[n.lineno - 1].strip() if n else None

_checks = ('test', 'test_eq', 'test_ne', 'test_fail', 'test_close', 'test_is', 'test_warns', 'test_eq_type', 'test_fig_exists', 'test_shuffled', 'test_stdout')

def only_checks(src):
    "Whether the code `src` is assertions alone: `assert` statements and fastcore.test calls (`test_eq`, `test_fail`...), nothing that makes or shows"
    try: tree = ast.parse(src)
    except SyntaxError: return False
    is_check = lambda st: isinstance(st, ast.Assert) or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and _call_name(st.value) in _checks)
    return bool(tree.body) and all(map(is_check, tree.body))

def should_show(src):
    "Whether the code `src` ends with an expression that displays something"
    try: tree = ast.parse(src)
    except SyntaxError: return False
    if not tree.body or not isinstance(tree.body[-1], ast.Expr) or src.rstrip().endswith(';'): return False
    v = tree.body[-1].value
    if isinstance(v, ast.Call):
        f = v.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ''
        return name in _show_calls
    return isinstance(v, _shows)

# ---------------------------------------------------------------------------------------------------------
# Markdown for pandoc (what Quarto would make of a processed notebook)

_md_link = re.compile(r'(\]\()([^)\s]+)')

def rewrite_links(text, nb, pages, site_url):
    "Site URLs and links to notebooks become links relative to `nb`'s page"
    here = Path(page_of(nb, pages.get(nb, {}))).parent
    up = '../' * len(here.parts)
    if site_url: text = text.replace(site_url.rstrip('/') + '/', up)
    def fix(m):
        target = m.group(2)
        path, frag = urldefrag(target)
        if not path.endswith('.ipynb') or '://' in path: return m.group(0)
        src = os.path.normpath(Path(nb).parent/unquote(path)).replace(os.sep, '/')
        if src not in pages: return m.group(0)  # left for the link check to report
        rel = os.path.relpath(page_of(src, pages[src]), here.as_posix() or '.')
        return m.group(1) + rel + (f'#{frag}' if frag else '')
    return _md_link.sub(fix, text)

def merge_streams(outputs):
    "Consecutive outputs of one stream as one (a cell that prints line by line shows one block, as Jupyter does)"
    res = []
    for o in outputs:
        if o.get('output_type') == 'stream' and res and res[-1].get('output_type') == 'stream' and res[-1].get('name') == o.get('name'):
            res[-1] = {**res[-1], 'text': _text(res[-1]['text']) + _text(o['text'])}
        else: res.append(o)
    return res

# The imports a page needs to document and test itself, which nbdev's template keeps in a hidden cell: not shown
_doc_imports = re.compile(r'^(?:from (?:nbdev\.showdoc|fastcore\.test|nbdev) import [^\n]*|import fastcore\.test[^\n]*)$\n?', re.M)

_md_heading = re.compile(r'^(#{1,4}) +(.+?) *$', re.M)
def _bare(h): return re.sub(r'[`*]', '', h).strip()

def unlist_repeated(md, parts):
    "A `show_doc` entry whose name is the section it sits in (`## RanksCB`, then `### RanksCB`) stays out of the contents: one line there, not two"
    last = next((m for p in reversed(parts) for m in reversed(list(_md_heading.finditer(p)))), None)
    if not last or '{' in md.split('\n', 1)[0]: return md
    def fix(m):
        return m.group(0) + ' {.unlisted}' if _bare(m.group(2)) == _bare(last.group(2)) and len(m.group(1)) > len(last.group(1)) else m.group(0)
    return _md_heading.sub(fix, md, count=1) if md.lstrip().startswith(('---', '#')) else md

_bare_entry = re.compile(r'^---\n\n\[source\]\([^)]*\)\{[^}]*\}\n\n#{2,4} (?P<name>\w+)\n\n```python\nclass (?P=name)\(\*args\)\n```\n\n\*(?P<doc>[^*\n]+)\*\s*$')

def exceptions_table(parts):
    "Three or more `show_doc` entries in a row of exceptions with nothing but a line of docstring (`CancelFitException`, ...): one table, each name keeping its anchor"
    out, run = [], []
    def flush():
        if len(run) >= 3:
            rows = '\n'.join(f"| []{{#{m['name'].lower()}}}`{m['name']}` | {m['doc']} |" for m in run)
            out.append(f"| exception | what raising it does |\n|---|---|\n{rows}")
        else: out.extend(m.group(0) for m in run)
        run.clear()
    for part in parts:
        if m := _bare_entry.match(part): run.append(m); continue
        flush(); out.append(part)
    flush()
    return out

_handler_entry = re.compile(r'^---\n\n\[source\]\([^)]*\)\{[^}]*\}\n\n#{2,4} (?P<cls>\w+)\.(?P<name>(?:before|after|cleanup|on)_\w+)\n\n'
                            r'```python\ndef (?P=name)\(\s*(?:self,\s*)?trainer\s*\):?\n```\n\n\*(?P<doc>[^*\n]+)\*\s*$')

def handlers_table(parts):
    "A callback's event handlers that take only the trainer and say one line (`CheckpointCB.before_fit`): a table under their callback, not entries of their own; each keeps its anchor"
    out, run = [], []
    def flush():
        if run:
            rows = '\n'.join(f"| []{{#{m['cls'].lower()}.{m['name']}}}`{m['name']}` | {m['doc']} |" for m in run)
            out.append(f"| `{run[0]['cls']}` at | what it does |\n|---|---|\n{rows}")
        run.clear()
    for part in parts:
        m = _handler_entry.match(part)
        if m and run and m['cls'] != run[0]['cls']: flush()
        if m: run.append(m); continue
        flush(); out.append(part)
    flush()
    return out

def one_diagram(parts):
    "A `show_doc` entry's docstring drawing (`event`'s loop) that the exported source right after it shows again: drawn once, in the source"
    for i, part in enumerate(parts[:-1]):
        if not part.startswith('---\n\n[source]'): continue
        nxt, lines, out, j = parts[i + 1], part.split('\n'), [], 0
        while j < len(lines):
            if lines[j].startswith('```'):
                k = next((k for k in range(j + 1, len(lines)) if lines[k].startswith('```')), len(lines) - 1)
                body = [l.strip() for l in lines[j + 1:k] if l.strip()]
                if lines[j] == '```' and len(body) > 3 and all(l in nxt for l in body): out += ['*(drawn in the exported source below)*', '']
                else: out += lines[j:k + 1]
                j = k + 1
            else: out.append(lines[j]); j += 1
        parts[i] = '\n'.join(out)
    return parts

def notebook_md(nb, pages, site_url):
    "Markdown for the processed notebook `nb` (relative to _proc/), and the problems found in its outputs"
    cells, problems, parts = cells_of(PROC/nb), [], []
    fm = front_matter(cells)
    meta = {k: fm[k] for k in ('title', 'description') if k in fm}
    parts.append('---\n' + yaml.dump(meta, sort_keys=False, allow_unicode=True, width=1000) + '---')
    for i, c in enumerate(cells[1:] if fm else cells, 1 if fm else 0):
        src = _text(c['source'])
        if c['cell_type'] == 'markdown': parts.append(src); continue
        if c['cell_type'] != 'code': continue
        opts, code = directives(src)
        if opts.get('include') == 'false': continue
        if not re.match(r'#\|\s*exports?\b', src): code = _doc_imports.sub('', code).strip('\n')  # as nbdev's template hides them
        if opts.get('echo') != 'false' and code.strip():
            block = f"```python\n{code}\n```"
            if 'code-fold' in opts:  # an `#| exports` cell: Quarto shows its code in a details element, open for 'show'
                summary = html.escape(opts.get('code-summary', 'Code').strip('"'))
                block = f"<details{' open' if opts['code-fold'] == 'show' else ''}>\n<summary>{summary}</summary>\n\n{block}\n\n</details>"
            parts.append(block)
        if opts.get('output') == 'false' or opts.get('eval') == 'false': continue
        for o in merge_streams(c.get('outputs', [])):
            md, problem = output_md(o, asis=opts.get('output') == 'asis')
            if problem: problems.append(f"cell {i}: {problem}")
            if md: parts.append(unlist_repeated(md, parts))
    parts = one_diagram(handlers_table(exceptions_table(parts)))
    return rewrite_links('\n\n'.join(parts) + '\n', nb, pages, site_url), problems

def nav_html(groups, page, pages):
    "The sidebar's HTML for `page`: home, then each group's pages, the current one marked"
    here = Path(page).parent
    def item(nb):
        target = page_of(nb, pages[nb])
        full = str(pages[nb].get('title', nb))
        title = re.sub(r'`([^`]+)`', r'<code>\1</code>', html.escape(sidebar_label(full)))
        cls = (' class="active"' if target == page else '') + (f' title="{html.escape(full)}"' if sidebar_label(full) != full else '')
        return f'<li><a href="{os.path.relpath(target, here.as_posix() or ".")}"{cls}>{title}</a></li>'
    out = [f'<ul class="nav-home">{item(HOME)}</ul>'] if HOME in pages else []
    for name, nbs in groups.items():
        out.append(f'<div class="nav-section">{html.escape(name)}</div><ul>' +
                   ''.join(item(nb) for nb in nbs if nb in pages) + '</ul>')
    return '\n'.join(out)

def _plain(title): return re.sub(r'`([^`]+)`', r'<code>\1</code>', html.escape(str(title)))

def pandoc_page(nb, md, page, nav, site_title, links, pager=None):
    "Render one page with pandoc (`pager`: {'prev': (page, title), 'next': ...}, the pages around it); return an error message or None"
    out = DOCS/page
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(out) + '.md').write_text(md)  # the Markdown page each module's `Docs:` line points to
    up = '../' * len(Path(page).parent.parts)
    navf = out.with_suffix('.nav.html'); navf.write_text(nav)
    cmd = ['pandoc', '--from=markdown-smart', '--to=html5', '--standalone', '--toc', '--toc-depth=3',
           f'--template={SITE/"page.html"}', f'--include-before-body={navf}', '--highlight-style=pygments', '--mathjax',
           f'--variable=root:{up}', f'--variable=site-title:{site_title}', f'--variable=md-link:{out.name}.md',
           '--metadata=lang:en', f'--output={out}'] + [f'--variable={k}-link:{up}{v}' for k, v in links.items()]
    for k, (target, title) in (pager or {}).items():
        cmd += [f'--variable={k}-link:{os.path.relpath(target, Path(page).parent.as_posix() or ".")}', f'--variable={k}-title:{_plain(title)}']
    r = subprocess.run(cmd, input=md, capture_output=True, text=True)
    navf.unlink()
    if r.returncode: return f"pandoc failed: {r.stderr.strip()[:500]}"
    if r.stderr.strip(): return f"pandoc warned: {r.stderr.strip()[:500]}"
    out.write_text(_table_breaks(out.read_text()))

_table, _code = re.compile(r'<table.*?</table>', re.S), re.compile(r'<code>[^<]*</code>')
def _table_breaks(page):
    "Names in tables may break after `_` and `.`, so that a wide table (the trainer's events) fits the page"
    brk = lambda m: re.sub(r'([_.])(?=\w)', r'\1<wbr>', m.group(0))
    # pandoc gives a table with long cells equal fixed column widths (7 columns of 14 %: "pytorch-accelerated" and names cut
    # at each underscore); without them the browser sizes each column to its content
    fit = lambda t: re.sub(r'<colgroup>.*?</colgroup>\n?', '', t.replace('<table style="width:100%;">', '<table>'), flags=re.S)
    first = lambda t: re.sub(r'(<tr[^>]*>\s*<td[^>]*>)(.*?)(</td>)', lambda c: c[1] + c[2].replace('<wbr>', '') + c[3], t, flags=re.S)  # names whole
    return _table.sub(lambda t: first(_code.sub(brk, fit(t.group(0)))), page)

def render_pandoc(pages, groups, site_url, site_title):
    "All pages with pandoc into _docs/; {notebook: [problem, ...]}"
    if DOCS.exists(): shutil.rmtree(DOCS)
    DOCS.mkdir()
    for f in ('site.css', 'search.js'): shutil.copy(SITE/f, DOCS/f)
    if (NBS/'images').is_dir(): shutil.copytree(NBS/'images', DOCS/'images')  # pictures the pages' Markdown names
    problems = {}
    links = {name.split()[-1].lower(): page_of(nbs[0], pages[nbs[0]]) for name, nbs in groups.items() if name in ('Tutorials', 'The kernel', 'Guides')}
    order = [nb for nb in [HOME] + [nb for nbs in groups.values() for nb in nbs] if nb in pages]  # the sidebar's order
    around = {nb: {k: (page_of(o, pages[o]), pages[o].get('title', o)) for k, o in (('prev', order[i - 1] if i else None),
                   ('next', order[i + 1] if i + 1 < len(order) else None)) if o} for i, nb in enumerate(order)}
    def one(nb):
        page = page_of(nb, pages[nb])
        md, probs = notebook_md(nb, pages, site_url)
        err = pandoc_page(nb, md, page, nav_html(groups, page, pages), site_title, links, around.get(nb))
        return nb, probs + ([err] if err else [])
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        for nb, probs in ex.map(one, sorted(pages)):
            if probs: problems[nb] = probs
    write_search_index(pages, order)
    return problems

_heading = re.compile(r'<h([1-4]) id="([^"]+)"[^>]*>(.*?)</h\1>', re.S)

def write_search_index(pages, order):
    "_docs/search_index.js, what the search box (scripts/site/search.js) reads: each page's address, title, headings and text"
    index = []
    for nb in order:
        page = page_of(nb, pages[nb])
        h = (DOCS/page).read_text(errors='replace')
        main = h[h.find('<main>'):h.find('</main>')]
        main = re.sub(r'<nav class="pager">.*?</nav>', '', main, flags=re.S)
        heads = [[i, re.sub(r'\s+', ' ', html.unescape(_tag.sub('', t))).strip()] for _, i, t in _heading.findall(main)]
        text = re.sub(r'\s+', ' ', html.unescape(_tag.sub(' ', _unshown.sub(' ', main)))).strip()
        index.append({'u': page, 't': str(pages[nb].get('title', nb)).replace('`', ''), 'h': heads, 'x': text})
    (DOCS/'search_index.js').write_text('window.SEARCH_INDEX = ' + json.dumps(index, ensure_ascii=False, separators=(',', ':')) + ';\n')

def render_quarto():
    "The real site, with Quarto (`nbdev-docs`)"
    from nbdev.quarto import nbdev_docs
    os.chdir(ROOT)
    nbdev_docs.__wrapped__()

# ---------------------------------------------------------------------------------------------------------
# Checks on the rendered site

class _Links(HTMLParser):
    "Every id and every link/image target of an HTML page"
    def __init__(self):
        super().__init__(); self.ids, self.links = set(), []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get('id'): self.ids.add(a['id'])
        if tag == 'a' and a.get('name'): self.ids.add(a['name'])
        if tag == 'a' and a.get('href'): self.links.append(a['href'])
        if tag == 'img' and a.get('src'): self.links.append(a['src'])

def parse_html(path):
    p = _Links(); p.feed(path.read_text(errors='replace')); return p

def check_links(site_url):
    "Dead links and anchors between the pages of _docs/, as `page: problem` strings"
    parsed = {p.relative_to(DOCS).as_posix(): parse_html(p) for p in DOCS.rglob('*.html') if 'site_libs' not in p.parts}
    bad = []
    for page, p in sorted(parsed.items()):
        for link in p.links:
            if link.startswith(('data:', 'mailto:', 'javascript:')): continue
            if site_url and link.startswith(site_url.rstrip('/') + '/'):
                target = link[len(site_url.rstrip('/')) + 1:]
            elif urlsplit(link).scheme or link.startswith('//'): continue  # another site
            else:
                path, frag = urldefrag(link)
                target = os.path.normpath(Path(page).parent/unquote(path)).replace(os.sep, '/') + (f'#{frag}' if frag else '') \
                         if path else f'{page}#{frag}'
            path, frag = urldefrag(target)
            if path.endswith('/') or path in ('', '.'): path += 'index.html'
            if path not in parsed:
                if not (DOCS/path).is_file(): bad.append(f"{page}: dead link {link!r} (no page {path})")
                continue
            if frag and unquote(frag) not in parsed[path].ids:
                hint = (f": nbdev links `{unquote(frag)}` in backticks to an entry that private names do not get; write "
                        f"<code>...</code> instead of backticks" if frag.startswith('_') else
                        f": if it is a method, add a cell `show_doc(...)` for it" if '.' in frag else '')
                bad.append(f"{page}: dead anchor {link!r} (no id {unquote(frag)!r} in {path}){hint}")
    return bad

_unshown = re.compile(r'<(pre|script|style)\b.*?</\1>|<code\b[^>]*>[^<]*\]\([^<]*</code>', re.S)  # code, and code about links
_tag, _raw_link = re.compile(r'<[^>]+>'), re.compile(r'(?<!!)\[[^\[\]\n]{1,200}\]\([^()\s]+\)')

def page_text(path, keep_code=False):
    "The text a reader sees on the HTML page `path` (without its code blocks unless `keep_code`)"
    h = path.read_text(errors='replace')
    return html.unescape(_tag.sub('', h if keep_code else _unshown.sub('', h)))

def check_raw_links():
    "Markdown links the renderer left as text (`[Plans](plans.html)`), outside code: nbdev or a table did not convert them"
    return [f"{p.relative_to(DOCS).as_posix()}: a link shown as text, not rendered: {m.group(0)!r}"
            for p in sorted(DOCS.rglob('*.html')) if 'site_libs' not in p.parts for m in _raw_link.finditer(page_text(p))]

def check_kernel_code(pages):
    "The kernel's pages show its code: every line of every exported cell of `nbs/core/` is on the notebook's page"
    bad = []
    for nb in (n for n in sorted(pages) if n.startswith('core/')):
        text = page_text(DOCS/page_of(nb, pages[nb]), keep_code=True)
        for i, c in enumerate(cells_of(NBS/nb)):
            if c['cell_type'] != 'code' or not re.match(r'#\|\s*exports?\b', src := _text(c['source'])): continue
            if missing := [l.strip() for l in directives(src)[1].splitlines() if l.strip() and l.strip() not in text]:
                bad.append(f"{nb}: cell {i} is exported but its code is not on its page (`{missing[0][:60]}`): make it `#| exports`")
    return bad

def check_docs_lines(site_url):
    "Each module's `Docs:` line must name a page of the site"
    bad = []
    for py in sorted((ROOT/'aisaac').rglob('*.py')):
        m = re.search(r'^Docs: (\S+?)(?:"{3}|\s|$)', py.read_text()[:1000], re.M)
        if not m or not site_url: continue
        url = m.group(1)
        if not url.startswith(site_url.rstrip('/') + '/'): bad.append(f"{py.relative_to(ROOT)}: Docs line {url} is not on {site_url}")
        elif not (DOCS/url[len(site_url.rstrip('/')) + 1:]).is_file():
            bad.append(f"{py.relative_to(ROOT)}: Docs line names {url}, which the site does not have")
    return bad

def check_outputs(nb):
    "Every page's cells that should show something show it, a tutorial or guide has outputs, and so has any notebook that shows something: problems of notebook `nb`"
    cells, bad, n_out = cells_of(PROC/nb), [], 0
    for i, c in enumerate(cells):
        if c['cell_type'] != 'code': continue
        opts, code = directives(_text(c['source']))
        n_out += len(c.get('outputs', []))
        if opts.get('eval') == 'false' or opts.get('output') == 'false': continue
        if not c.get('outputs') and should_show(code):
            bad.append(f"cell {i} shows nothing but ends with `{code.strip().splitlines()[-1][:60]}`")
    has_code = any(c['cell_type'] == 'code' and directives(_text(c['source']))[1].strip() for c in cells)
    if n_out == 0 and has_code and nb.startswith(OUTPUTS_REQUIRED): return [f"no outputs at all: run `make docs NBS=nbs/{nb}` to execute it and save its outputs"]
    return bad + [f"run `make docs NBS=nbs/{nb}` to execute it and save its outputs"] if bad else check_saved_outputs(nb)

def check_saved_outputs(nb):
    "A notebook with a cell that prints, plots or shows something is saved with outputs (`show_doc` aside: nbdev redoes those)"
    cells = cells_of(NBS/nb)
    if any(c.get('outputs') for c in cells if c['cell_type'] == 'code'): return []
    for i, c in enumerate(cells):
        if c['cell_type'] != 'code': continue
        opts, code = directives(_text(c['source']))
        if opts.get('eval') == 'false' or opts.get('output') == 'false': continue
        if line := shown_by(code):
            return [f"saved without outputs, though cell {i} shows something (`{line[:60]}`), so its page shows none: "
                    f"run `make docs NBS=nbs/{nb}` to execute it and save its outputs"]
    return []

# In the browser: what a reader at 1280 px sees (headless Chromium)

def in_chromium(pages, width=1280, height=900, search=None, root=None, timeout=600):
    """Load each page (relative to `root`, default _docs/) in a `width` px frame of headless Chromium and measure its code blocks
    with scripts/site/check.js: {page: [problem, ...]}; with `search`, also type it into the home page's search box:
    then the result is ({page: problems}, [result link, ...])"""
    import tempfile
    exe, root = chromium(), Path(root or DOCS).resolve()
    if not exe: return None
    with tempfile.TemporaryDirectory() as tmp:
        harness = Path(tmp)/'harness.html'
        urls = [(root/p).as_uri() for p in pages]
        harness.write_text(f"""<!DOCTYPE html><html><body><iframe id="f" style="width:{width}px;height:{height}px;border:0"></iframe>
<pre id="out"></pre><script>{(SITE/'check.js').read_text()}
const urls = {json.dumps(urls)}, names = {json.dumps(list(pages))}, search = {json.dumps(search)}, home = {json.dumps((root/'index.html').as_uri())};
const f = document.getElementById('f'), res = {{}}; let i = 0;
function done(extra) {{ document.getElementById('out').textContent = 'RESULT' + JSON.stringify({{pages: res, search: extra}}) + 'END'; }}
function typeSearch() {{
  f.onload = () => {{
    const d = f.contentDocument, box = d.querySelector('#search-box');
    if (!box) return done(null);
    box.focus(); box.value = search; box.dispatchEvent(new Event('input', {{bubbles: true}}));
    let n = 0; const poll = () => {{
      const links = [...d.querySelectorAll('#search-results a')].map(a => a.getAttribute('href'));
      if (links.length || ++n > 50) done(links); else setTimeout(poll, 100); }};
    poll();
  }};
  f.src = home;
}}
function next() {{
  if (i >= urls.length) return search === null ? done(null) : typeSearch();
  f.src = urls[i];
}}
f.onload = () => {{ try {{ res[names[i]] = measureCode(f.contentDocument); }} catch (e) {{ res[names[i]] = [{{kind: 'error', line: String(e)}}]; }} i++; next(); }};
next();
</script></body></html>""")
        r = subprocess.run([exe, '--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--allow-file-access-from-files',
                            '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run',
                            f'--user-data-dir={tmp}/profile', f'--window-size={width + 40},{height + 200}',
                            f'--virtual-time-budget={max(60000, 2000 * len(pages))}', '--dump-dom', harness.as_uri()],
                           capture_output=True, text=True, timeout=timeout)
    m = re.search(r'RESULT(.*?)END', html.unescape(r.stdout), re.S)
    if not m: return {'(chromium)': [f"no result from headless Chromium (exit {r.returncode}): {r.stderr.strip()[-300:]}"]}
    out = json.loads(m.group(1))
    probs = {}
    for page, bad in out['pages'].items():
        for b in bad:
            if b['kind'] == 'cut':
                probs.setdefault(page, []).append(f"code block {b['block']} ({b['where'] or 'no id'}) is cut at {width} px: its widest line has "
                                                  f"{b['chars']} characters, its box shows {b['cap']} (`{b['line']}`)")
            elif b['kind'] == 'narrow':
                probs.setdefault(page, []).append(f"code block {b['block']} ({b['where'] or 'no id'}) wraps a line of {b['chars']} characters at "
                                                  f"{width} px (its box holds {b['cap']}; 120 must fit) (`{b['line']}`)")
            else: probs.setdefault(page, []).append(f"could not measure the page: {b['line']}")
    missing = [p for p in pages if p not in out['pages']]
    if missing: probs['(chromium)'] = [f"pages not measured: {missing[:5]}"]
    return (probs, out['search']) if search is not None else probs

def check_in_chromium(pages, search='MetricsCB', expect='callbacks/metrics.html'):
    "The check's browser part: every page's code blocks at 1280 px, and the search box finding `search` on `expect`"
    if not chromium():
        if os.environ.get('CI'): return ["no chromium on PATH, so the code blocks were not measured: `apt-get install chromium`"]
        print("!!! docs: no chromium on PATH (`apt-get install chromium`): the code blocks' widths are not measured"); return []
    res = in_chromium([page_of(nb, pages[nb]) for nb in sorted(pages)], search=search)
    probs, found = res if isinstance(res, tuple) else (res, None)
    bad = [f"{page}: {p}" for page, ps in sorted(probs.items()) for p in ps]
    if search and (found is None or not any(urlsplit(l).path.endswith(expect) for l in found)):
        bad.append(f"index.html: typing {search!r} in the search box does not find {expect} (results: {(found or [])[:5]})")
    return bad

# What a saved output should not show (as tests/test_notebooks.py refuses the machine's own paths): a temporary folder's
# random name, and a warning printed with the file, line and source line that raised it. scripts/run_nbs.py saves
# them as `<tmp>` and `UserWarning: message`.
_temp_path = re.compile(r"(?<![\w.])(?:/private)?(?:/tmp|/var/tmp|/var/folders/[\w.+-]+/[\w.+-]+/T)/(?:tmp|pytest-of-)[\w.-]*[^\s'\"):,]*")
_warning_source = re.compile(r"^(\S[^\n]*?:\d+: \w*Warning: [^\n]{0,60})", re.M)

def check_clean_outputs(nb):
    "Temporary paths and warnings' source lines in the saved outputs of notebook `nb` (relative to nbs/): problems"
    bad = []
    for i, c in enumerate(cells_of(NBS/nb)):
        for o in c.get('outputs', []):
            text = _text(o.get('text', '')) + ''.join(_text(v) for k, v in o.get('data', {}).items() if k.startswith('text/'))
            if m := _temp_path.search(text):
                bad.append(f"cell {i}: a temporary path in its output ({m.group(0)!r}): print it relative to its folder, or save the page "
                           f"again with `scripts/run_nbs.py --skip-slow nbs/{nb}` (which shows temporary folders as <tmp>)")
            if m := _warning_source.search(text):
                bad.append(f"cell {i}: a warning with its file and line ({m.group(1)!r}...): filter it, or save the page again with "
                           f"`scripts/run_nbs.py --skip-slow nbs/{nb}` (which shows a warning as `UserWarning: message`)")
    return bad

def doc_coverage():
    "scripts/doc_coverage.py, as a module"
    import importlib.util
    spec = importlib.util.spec_from_file_location('doc_coverage', SITE.parent/'doc_coverage.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod

def build(strict=True):
    "Process, render and check; return the problems as lines"
    from nbdev.config import get_config
    t0 = time.time()
    problems = [f"{nb}: no sidebar group takes it; number it by its layer or add a rule to SIDEBAR in scripts/docs.py"
                for nb in write_sidebar()]
    unrun = [f"{nb} cell {i}: nbdev's processing runs it (it has an import) but never runs the cells that make "
             f"{', '.join(names)}: put its imports in a cell of their own" for nb, i, names in doc_coverage().docs_run_problems()]
    if unrun: return problems + unrun
    try: process()
    except Exception as e: return problems + [f"nbdev could not process the notebooks: {type(e).__name__}: {e}"]
    for nb in notebooks():
        if (PROC/nb).exists(): fix_processed(nb)
    cfg = get_config()
    site_url = f"{cfg.doc_host}{cfg.doc_baseurl}" if cfg.get('doc_host') else ''
    pages = {}
    for nb in notebooks():
        if not (PROC/nb).exists(): problems.append(f"{nb}: nbdev did not process it"); continue
        fm = front_matter(cells_of(PROC/nb))
        if not fm.get('title'): problems.append(f"{nb}: no title (start the notebook with a `# Title` cell and a `> description` line)")
        pages[nb] = fm
    t1 = time.time()
    if shutil.which('quarto'):
        renderer = 'quarto'
        try: render_quarto()
        except SystemExit as e: return problems + [f"quarto render failed (exit {e.code})"]
    elif shutil.which('pandoc'):
        renderer = 'pandoc'
        groups, _ = sidebar_groups()
        for nb, probs in render_pandoc(pages, groups, site_url, cfg.get('title', 'docs')).items():
            problems += [f"{nb}: {p}" for p in probs]
    else:
        msg = "neither quarto nor pandoc is installed, so no page was rendered: run `make docs-tools` (Debian package `pandoc`)"
        if os.environ.get('CI'): return problems + [msg]  # CI must check the pages
        print(f"!!! docs: {msg}; the links and pages are not checked")
        return problems + [f"{nb}: {p}" for nb in pages for p in check_outputs(nb)]
    for nb in pages:
        page = DOCS/page_of(nb, pages[nb])
        if not page.is_file(): problems.append(f"{nb}: its page {page.relative_to(ROOT)} was not rendered")
    problems += check_links(site_url) + check_docs_lines(site_url) + check_raw_links() + check_kernel_code(pages)
    if renderer == 'pandoc': problems += check_in_chromium(pages)  # Quarto's pages: its own CSS (nbs/styles.css), not measured here
    problems += [f"{nb}: {name} is documented here and in {', '.join(others)}" if others else f"{nb}: {name} is documented twice"
                 for nb, name, others in doc_coverage().duplicate_entries()]
    for nb in pages: problems += [f"{nb}: {p}" for p in check_outputs(nb) + check_clean_outputs(nb)]
    print(f">>> docs: {len(pages)} pages processed by nbdev in {t1 - t0:.1f} s, rendered by {renderer} "
          f"and checked in {time.time() - t1:.1f} s: {DOCS.relative_to(ROOT)}/index.html")
    return problems

# ---------------------------------------------------------------------------------------------------------
# Screenshots

def chromium():
    return next((b for b in ('chromium', 'chromium-browser', 'google-chrome') if shutil.which(b)), None)

def shots(pages, out=ROOT/'out'/'shots', width=1280, height=1600):
    "PNG screenshots of rendered pages (paths relative to _docs/) with headless Chromium"
    exe = chromium()
    if not exe: sys.exit("!!! no chromium on PATH: `apt-get install chromium` (Debian) to take screenshots")
    out.mkdir(parents=True, exist_ok=True)
    import tempfile
    for page in pages:
        src = DOCS/page
        if not src.is_file(): print(f"!!! {src} does not exist: run `make site` first"); continue
        png = out/(page.replace('/', '__').removesuffix('.html') + '.png')
        with tempfile.TemporaryDirectory() as prof:
            subprocess.run([exe, '--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
                            '--disable-component-update', '--disable-sync', '--no-first-run', '--hide-scrollbars',
                            f'--user-data-dir={prof}', f'--window-size={width},{height}', f'--screenshot={png}',
                            src.as_uri()], capture_output=True, timeout=120)
        print(png if png.exists() else f"!!! no screenshot of {page}")

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('command', choices=['check', 'render', 'sidebar', 'shots'])
    ap.add_argument('pages', nargs='*', help='for `shots`: pages relative to _docs/, e.g. tutorials/callbacks.html')
    ap.add_argument('--height', type=int, default=1600, help='for `shots`: the window height in pixels')
    ap.add_argument('--width', type=int, default=1280, help='for `shots`: the window width in pixels')
    args = ap.parse_args()
    if args.command == 'sidebar':
        lost = write_sidebar()
        print(f"wrote {NBS/'sidebar.yml'}")
        if lost: sys.exit("!!! no group of SIDEBAR takes: " + ', '.join(lost))
    elif args.command == 'shots': shots(args.pages or ['index.html'], width=args.width, height=args.height)
    else:
        problems = build()
        if problems:
            print(f"!!! docs: {len(problems)} problem(s):\n  " + '\n  '.join(problems))
            if args.command == 'check': sys.exit(1)
        else: print(">>> docs: every page rendered; no dead link or anchor; every page shows its outputs")
