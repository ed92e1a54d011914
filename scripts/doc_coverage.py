#!/usr/bin/env python
"""Is every export documented? A docstring, its parameters (docments) and an entry on the docs site.

    python scripts/doc_coverage.py          # list the problems (tests/test_docs.py fails on any)
    python scripts/doc_coverage.py --fix    # add the missing `show_doc(Class.method)` cells, then list the rest

The walk covers every name in the `__all__` of every aisaac module that aisaac defines (re-exports of torch,
torcheval... are theirs to document), and every public method and property of the exported classes.
- A function, class, method or property needs its own docstring (a method does not inherit its parent's:
  an override says what it does differently).
- Every parameter needs a docment: `lr:float=1e-3, # learning rate`. Exempt: `self`, `cls`, and the
  `trainer` that every callback hook receives (the `Callback` page documents it once).
- Every export and public method needs an entry on the site: nbdev adds a `show_doc` after each exported
  `def`/`class` and each `@patch`ed method, but a method defined inside a class needs a cell
  `show_doc(Class.method)` (properties are shown with their class).
- Every entry once: an object documented on two pages, or twice on one, is reported (`duplicate_entries`; the
  docs check and `tests/test_docs.py` fail on it). nbdev adds a `show_doc` for a `@patch`ed method even when a
  cell of the notebook shows it already: leave that one to nbdev.
Each problem names the notebook that defines the name. `--fix` inserts the missing `show_doc` cells right
after the exported cell that defines the class (and the `show_doc` import where the notebook lacks it);
docstrings and docments need words, so those are left to you.
"""
import argparse, ast, importlib, inspect, json, pkgutil, re, secrets, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT/'nbs'
EXEMPT_PARAMS = {'self', 'cls', 'return'}

def notebooks():
    return [nb for nb in sorted(NBS.rglob('*.ipynb')) if not any(p.startswith(('.', '_')) for p in nb.relative_to(NBS).parts)]

def _code(src):
    "The Python of a cell: directives, magics and shell lines dropped"
    return '\n'.join(l for l in src.splitlines() if not l.lstrip().startswith(('#|', '%', '!')))

def _parse(src):
    try: return ast.parse(_code(src))
    except SyntaxError: return None

def _is_export(src): return bool(re.match(r'\s*#\|\s*exports?\b', src))

def _defined(node):
    "The name a top-level def/class of an exported cell gets on the site: `f`, `Class`, or `Class.method` when patched"
    args = getattr(node, 'args', None)
    if any('patch' in ast.unparse(d) for d in node.decorator_list) and args and args.args and args.args[0].annotation is not None:
        return f'{ast.unparse(args.args[0].annotation)}.{node.name}'
    return node.name

def site_entries():
    """What the notebooks put on the site: ({'Trainer', 'Trainer.fit', ...}, {name: notebook defining it})"""
    shown, where = set(), {}
    for nb in notebooks():
        for c in json.loads(nb.read_text())['cells']:
            src = ''.join(c['source'])
            if c['cell_type'] != 'code' or (tree := _parse(src)) is None: continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'show_doc' and node.args:
                    shown.add(ast.unparse(node.args[0]))
            if not _is_export(src): continue
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    name = _defined(node)
                    shown.add(name); where.setdefault(name, nb.relative_to(ROOT).as_posix())
    return shown, where

def page_entries(nb):
    "The names of the `show_doc` entries of notebook `nb`'s page, in order: its own cells' and those nbdev adds for the definitions of exported cells"
    from nbdev.process import NBProcessor
    from nbdev.processors import add_show_docs
    proc = NBProcessor(nb, procs=[add_show_docs])
    proc.process()
    return [ast.unparse(n.args[0]) for c in proc.nb.cells if c.cell_type == 'code' and (t := _parse(c.source)) is not None
            for n in ast.walk(t) if isinstance(n, ast.Call) and getattr(n.func, 'id', None) == 'show_doc' and n.args]

def _resolver(nb):
    "A function giving the object a `show_doc` name of notebook `nb` stands for: seen from aisaac's names and its module's, then from what its cells import"
    ns, cells = {}, json.loads(nb.read_text())['cells']
    exec('from aisaac.all import *', ns)
    srcs = [''.join(c['source']) for c in cells if c['cell_type'] == 'code']
    if m := next((re.search(r'^#\|\s*default_exp\s+(\S+)', s, re.M) for s in srcs if '#| default_exp' in s), None):
        ns.update(vars(importlib.import_module(f'aisaac.{m.group(1)}')))
    imports = [l for s in srcs for l in s.splitlines() if re.match(r'(from \S+ import|import) ', l)]
    def resolve(name):
        try: return eval(name, ns)
        except NameError:
            while imports:  # (importing what a notebook imports can take seconds: only when a name needs it)
                try: exec(imports.pop(0), ns)
                except Exception: pass
            return eval(name, ns)
    return resolve

def duplicate_entries():
    "[(notebook, name, [other notebooks])]: an object documented twice on one page (no others) or on several pages"
    first, res = {}, []
    for nb in notebooks():
        resolve, where = None, nb.relative_to(ROOT).as_posix()
        for name in page_entries(nb):
            resolve = resolve or _resolver(nb)
            try: o = resolve(name)
            except Exception: key = (where, name)  # a name only the notebook knows: compared on its page only
            else: key = id(inspect.unwrap(getattr(o, 'fget', None) or getattr(o, '__func__', o)))
            if key not in first: first[key] = where
            else: res.append((where, name, [] if first[key] == where else [first[key]]))
    return res

def _star_names(module):
    "The names `from module import *` binds"
    try: m = importlib.import_module(module)
    except Exception: return None
    return set(getattr(m, '__all__', [k for k in dir(m) if not k.startswith('_')]))

def _names(tree, inner:bool):
    """Names a cell binds. `inner=False`: for the cells after it (top-level assignments, definitions and imports, not a
    function's locals); `inner=True`: anywhere, arguments included (what its own code may read without another cell)"""
    out = set()
    def visit(n):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
            if not inner: return
        if isinstance(n, ast.Lambda) and not inner: return
        if isinstance(n, ast.arg) and inner: out.add(n.arg)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store): out.add(n.id)
        if isinstance(n, (ast.Import, ast.ImportFrom)): out.update((a.asname or a.name).split('.')[0] for a in n.names)
        if isinstance(n, ast.ExceptHandler) and n.name: out.add(n.name)
        for ch in ast.iter_child_nodes(n): visit(ch)
    for n in tree.body: visit(n)
    return out

def docs_run_problems(nbs=None):
    """[(notebook, cell index, [names])]: cells that nbdev's docs processing runs (`exec_show_docs`: exported cells, `show_doc`
    and every cell with an import) but that read a name only a cell it does not run defines, or start loader workers (spawned
    there, they cannot find a class the notebook defined): the docs build fails there (a `NameError`, or worse, a fit started
    where its data was never made). The fix: the imports in a cell of their own."""
    import builtins, warnings
    from nbdev.process import NBProcessor
    from nbdev.processors import _do_eval
    res = []
    for nb in (nbs or notebooks()):
        known, star_failed = set(dir(builtins)) | {'show_doc', 'display', 'get_ipython', '__file__'}, False
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            cells = NBProcessor(nb).nb.cells
            runs = [(i, c) for i, c in enumerate(cells) if c.cell_type == 'code' and _do_eval(c)]
        for i, c in runs:
            tree = _parse(c.source)
            if tree is None: continue
            for n in ast.walk(tree):
                if isinstance(n, ast.ImportFrom) and any(a.name == '*' for a in n.names):
                    names = _star_names(n.module)
                    if names is None: star_failed = True
                    else: known |= names
            read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            missing = read - known - _names(tree, inner=True)
            exported = bool(c.directives_.keys() & {'export', 'exports', 'exporti'})
            if not exported and re.search(r'num_workers\s*=\s*[1-9]', c.source): missing = missing | {'(worker processes: num_workers)'}
            if missing and not star_failed and not exported:  # (a function may name one defined later)
                res.append((Path(nb).relative_to(ROOT).as_posix() if Path(nb).is_relative_to(ROOT) else str(nb), i, sorted(missing)))
            known |= _names(tree, inner=False)
    return res

def _modules():
    import aisaac
    for m in pkgutil.walk_packages(aisaac.__path__, 'aisaac.'):
        if not m.name.rsplit('.', 1)[-1].startswith('_'): yield importlib.import_module(m.name)

def _own(o): return (getattr(o, '__module__', None) or '').split('.')[0] == 'aisaac' and type(o).__name__ != 'LazyObject'  # (a stand-in for another library's object: theirs)

def exports():
    "(name, object, kind, defining module) for every export and every public member of an exported class"
    seen = set()
    for mod in _modules():
        for name in getattr(mod, '__all__', []):
            o = getattr(mod, name, None)
            if not (callable(o) and _own(o)) or id(o) in seen: continue
            if getattr(o, '__name__', name) != name and o.__name__ in mod.__all__: continue  # an alias: walked by its own name
            seen.add(id(o))
            yield name, o, 'class' if inspect.isclass(o) else 'function', o.__module__
            if not inspect.isclass(o): continue
            for k, v in vars(o).items():
                f = v.fget if isinstance(v, property) else getattr(v, '__func__', v)
                if k.startswith('_') or not (inspect.isfunction(f) and _own(f)): continue
                yield f'{name}.{k}', v, 'property' if isinstance(v, property) else 'method', f.__module__

def _own_params(f):
    "The parameters `f`'s own code declares (not those `fastcore.delegates` copied from another function)"
    code = getattr(f, '__code__', None)
    if code is None: return None
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return set(code.co_varnames[:n])

def undocumented_params(f, skip=()):
    "The parameters of `f` without a docment (those delegated to another function are documented there)"
    from fastcore.docments import docments
    f = inspect.unwrap(f)
    try: docs = docments(f, full=False, args_kwargs=True)
    except (TypeError, ValueError, OSError): return []
    own = _own_params(f)
    return [p for p, d in docs.items() if d is None and p not in EXEMPT_PARAMS and p not in skip and (own is None or p in own)]

def problems():
    "[(notebook, name, what, message)] for every gap; `what` is 'docstring', 'params' or 'entry'"
    from aisaac.core.callback import Callback
    shown, where = site_entries()
    res = []
    for qual, o, kind, modname in exports():
        cls_name = qual.split('.')[0]
        nb = where.get(qual) or where.get(cls_name) or f'(the notebook of {modname})'
        f = o.fget if kind == 'property' else getattr(o, '__func__', o)
        doc = o.__doc__ if kind == 'class' else inspect.unwrap(f).__doc__
        if not (doc or '').strip(): res.append((nb, qual, 'docstring', f'{qual} ({kind}) has no docstring'))
        if kind == 'property': continue
        if kind == 'class':
            init = vars(o).get('__init__')
            und = undocumented_params(init) if init is not None and _own(init) else []
        else:
            cls = getattr(inspect.getmodule(f), cls_name, None) if kind == 'method' else None
            hook = inspect.isclass(cls) and issubclass(cls, Callback)
            und = undocumented_params(f, skip={'trainer'} if hook else ())
        if und: res.append((nb, qual, 'params', f'{qual} has undocumented parameters {und}: add a docment, e.g. `{und[0]}, # what it is`'))
        alias = getattr(o, '__name__', None) not in (None, qual.split('.')[-1])  # `get_model = get_model_conv`: shown as the original
        elsewhere = getattr(f, '__qualname__', qual) in shown  # a layer's method a class wraps (`Checkpoints.save_checkpoint`)
        if qual not in shown and not alias and not elsewhere:
            res.append((nb, qual, 'entry', f'{qual} has no entry on the docs site: add a cell `show_doc({qual})`'))
    return res

def report(probs):
    lines = [f'{nb}: {msg}' for nb, _, _, msg in probs]
    if any(w == 'entry' for _, _, w, _ in probs):
        lines.append('(`python scripts/doc_coverage.py --fix` adds the missing show_doc cells)')
    return lines

def _cell(src):
    return {'cell_type': 'code', 'execution_count': None, 'id': secrets.token_hex(4), 'metadata': {}, 'outputs': [],
            'source': src.splitlines(keepends=True)}

def fix(probs):
    "Insert the missing `show_doc(Class.method)` cells after the cell that defines each class; return the notebooks changed"
    todo = {}
    for nb, qual, what, _ in probs:
        if what == 'entry' and '.' in qual and not nb.startswith('('): todo.setdefault(nb, []).append(qual)
    for nb, quals in todo.items():
        path = ROOT/nb
        d = json.loads(path.read_text())
        cells = d['cells']
        for qual in quals:
            cls = qual.split('.')[0]
            i = next(i for i, c in enumerate(cells) if c['cell_type'] == 'code' and _is_export(''.join(c['source']))
                     and (t := _parse(''.join(c['source']))) and any(isinstance(n, ast.ClassDef) and n.name == cls for n in t.body))
            while i + 1 < len(cells) and ''.join(cells[i + 1]['source']).startswith('show_doc('): i += 1  # after the ones already there
            cells.insert(i + 1, _cell(f'show_doc({qual})'))
        srcs = [''.join(c['source']) for c in cells if c['cell_type'] == 'code']
        if not any(re.search(r'^from nbdev.showdoc import .*show_doc', s, re.M) for s in srcs):
            j = next((i for i, c in enumerate(cells) if c['cell_type'] == 'code' and not _is_export(''.join(c['source']))
                      and re.search(r'^(from|import) ', ''.join(c['source']), re.M)), None)
            cells.insert(1 if j is None else j + 1, _cell('from nbdev.showdoc import show_doc'))  # a cell of its own
        path.write_text(json.dumps(d, indent=1, ensure_ascii=False) + '\n')
        subprocess.run([str(Path(sys.executable).parent/'nbdev-clean'), '--fname', str(path)], check=True, cwd=ROOT)
        print(f'{nb}: added {", ".join(f"show_doc({q})" for q in quals)}')
    return list(todo)

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--fix', action='store_true', help='add the missing show_doc cells')
    args = ap.parse_args()
    probs = problems()
    if args.fix and fix(probs): probs = problems()
    if probs: sys.exit(f'{len(probs)} documentation problem(s):\n  ' + '\n  '.join(report(probs)))
    print('every export has a docstring, documented parameters and an entry on the docs site')
