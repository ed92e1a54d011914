"""The kernel (`aisaac.core`) is the design card: small, importing nothing else of aisaac, and whole without any layer.

Its own tests (`kernel_*` below) run on the kernel's classes; each layer is then added to them, alone, and they still pass; and
in a process where a layer cannot be imported at all, they pass too. Also: no layer patches a private method of the kernel's
classes, no module imports another only for its side effect, and the code the notebooks show with `view_source_code` is the code."""
import ast, inspect, json, os, re, subprocess, sys, textwrap
from pathlib import Path
import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
PKG, NBS = ROOT/'aisaac', ROOT/'nbs'
LAYERS = ['compat', 'policy', 'around', 'rewrite', 'declared', 'depends', 'guards', 'registry', 'overview', 'plans', 'dispatch',
          'clock', 'steps', 'logs', 'ranks', 'persist', 'checkpoint', 'evals', 'params', 'trainer']

# ---------------------------------------------------------------- the kernel's own tests, on any pair of (CallbackMixin, Trainer) classes

def kernel_classes():
    from aisaac.core.dispatch import CallbackMixin
    from aisaac.core.trainer import Trainer
    return CallbackMixin, Trainer

def _dls(n=3):
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 2, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]
    return type('DLs', (), {'train': batches, 'valid': batches[:1]})()

class _Steps:
    core = True
    def predict(self, t): t.preds = t.model(t.batch[0])
    def get_loss(self, t): t.loss = t.loss_func(t.preds, t.batch[1])
    def backward(self, t): t.loss.backward()
    def step(self, t): t.opt.step()
    def zero_grad(self, t): t.opt.zero_grad()

class _Log:
    def __init__(self): self.seen = []
    def run_event(self, event, trainer, **kwargs): self.seen.append(event)

def kernel_fit_fires_the_loop_in_order(Mixin, Trainer):
    torch.manual_seed(0)
    log = _Log()
    t = Trainer(_dls(2), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[_Steps()])
    w = t.model.weight.detach().clone()
    t.fit(1, lr=0.1, callbacks=log)
    seen = [e for e in log.seen if not e.startswith(('log', 'before_data_epoch'))]
    batch = ['before_dataloader', 'after_dataloader', 'before_batch', 'before_predict', 'predict', 'after_predict', 'before_loss',
             'get_loss', 'after_loss']
    train = batch + ['before_backward', 'backward', 'after_backward', 'before_step', 'step', 'after_step', 'before_zero_grad', 'zero_grad',
                     'after_zero_grad', 'after_batch', 'cleanup_batch', 'checkpoint']
    valid = batch + ['after_batch', 'cleanup_batch']
    assert seen == ['before_fit', 'before_train', 'before_epoch', *train, *train, 'before_dataloader', 'after_epoch', 'cleanup_epoch',
                    'after_train', 'cleanup_train', 'before_validate', 'before_epoch', *valid, 'before_dataloader', 'after_epoch',
                    'cleanup_epoch', 'after_validate', 'cleanup_validate', 'checkpoint', 'after_fit', 'cleanup_fit'], seen
    assert not torch.equal(w, t.model.weight) and log not in t.cbs  # it trained; the fit's callback is gone

def kernel_cancels_end_their_phase_and_cleanup_runs(Mixin, Trainer):
    from aisaac.core.callback import CancelBatchException, CancelStepException, CancelFitException
    class Skip:
        def __init__(self): self.cleanups, self.skipped = [], []
        def before_batch(self, t):
            if t.training and t.batch_num == 1: raise CancelBatchException()
        def before_step(self, t):
            if t.batch_num == 2: raise CancelStepException('not now')
        def step_skipped(self, t, reason): self.skipped.append(reason)
        def cleanup_batch(self, t): self.cleanups.append(t.outcome)
        def after_fit(self, t): raise CancelFitException()
    s = Skip()
    t = Trainer(_dls(3), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[_Steps(), s])
    t.fit(1, lr=0.1, valid=False)
    assert s.cleanups == ['ok', 'cancelled', 'ok'] and s.skipped == ['not now'] and t.outcome == 'cancelled'

def kernel_callbacks_sort_group_and_name(Mixin, Trainer):
    class A:
        def __init__(self, order=0): self.order = order
    class Group:
        def __init__(self, *members): self.callbacks = list(members)
    class Box(Mixin): pass
    box, late, core, a1, a2 = Box(), A(5), type('Core', (A,), {'core': True})(), A(), A()
    inner = Group(a2); outer = Group(a1, inner)
    box.add_callbacks([late, outer, core])  # a group is added with its members, depth first
    assert box.cbs == [core, outer, a1, inner, a2, late] and box.A is late and box.A_1 is a1 and box.A_2 is a2 and box.Group_1 is inner
    box.remove_callbacks([late, outer])
    assert box.cbs == [core] and not hasattr(box, 'A') and not hasattr(box, 'A_1')
    box.add_callbacks(core2 := A())
    with pytest.raises(ValueError, match='added already'): box.add_callbacks(core2)

def kernel_handlers_get_the_arguments_they_name_and_cleanup_runs_all(Mixin, Trainer):
    from aisaac.core.dispatch import with_cbs
    class Box(Mixin):
        @with_cbs('load')
        def load(self): return 'loaded'
    class At:
        def __init__(self): self.seen = []
        def checkpoint(self, box, at): self.seen.append(at)
        def cleanup_load(self, box): self.seen.append('cleanup')
    class Broken:
        def cleanup_load(self, box): raise OSError('disk gone')
    box, at = Box(), At()
    box.add_callbacks([Broken(), at])
    box.run_callbacks('checkpoint', at='batch')
    with pytest.raises(OSError, match='disk gone'): box.load()
    assert at.seen == ['batch', 'cleanup']

def kernel_switch_off_takes_effect_at_once(Mixin, Trainer):
    class Off:
        def before_go(self, box): box.switch_off([box.Mute])
    class Mute:
        def __init__(self): self.n = 0
        def before_go(self, box): self.n += 1
    class Box(Mixin): pass
    box = Box(); box.add_callbacks([Off(), m := Mute()])
    box.run_callbacks('before_go')
    assert m.n == 0
    box.switch_on(); box.remove_callbacks(box.Off); box.run_callbacks('before_go')
    assert m.n == 1

def kernel_with_cbs_runs_on_any_object_with_run_callbacks(Mixin, Trainer):
    from aisaac.core.callback import CancelFitException
    from aisaac.core.dispatch import with_cbs
    class Mine:
        def __init__(self): self.log = []
        def run_callbacks(self, name): self.log.append(name)
        @with_cbs('fit', CancelFitException)
        def fit(self, stop=False):
            if stop: raise CancelFitException()
            return 'done'
    m = Mine()
    assert m.fit() == 'done' and m.fit(stop=True) is None
    assert m.log == ['before_fit', 'after_fit', 'cleanup_fit', 'before_fit', 'cleanup_fit']
    with pytest.raises(TypeError, match='needs an object with a `run_callbacks\\(event\\)` method.*subclass `CallbackMixin`'):
        with_cbs('x')(lambda self: None)(object())

def kernel_request_stop_ends_the_fit_after_the_epochs_checkpoint(Mixin, Trainer):
    class Stop:
        def after_train(self, t): t.request_stop('enough')
        def checkpoint(self, t, at):
            if at == 'epoch': self.epoch = t.epoch
    t = Trainer(_dls(2), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[_Steps(), s := Stop()])
    t.fit(5, lr=0.1)
    assert (t.epoch, s.epoch, t.stop_reason) == (0, 0, 'enough')

def kernel_an_error_reaches_on_exception_and_goes_on_up(Mixin, Trainer):
    class Boom:
        def after_loss(self, t): raise ValueError('boom')
        def on_exception(self, t, exception): self.got = exception
    t = Trainer(_dls(2), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[_Steps(), b := Boom()])
    with pytest.raises(ValueError, match='boom'): t.fit(1)
    assert isinstance(b.got, ValueError) and b in t.cbs

KERNEL_TESTS = [f for name, f in sorted(globals().items()) if name.startswith('kernel_') and name != 'kernel_classes']

@pytest.mark.parametrize('case', KERNEL_TESTS, ids=lambda f: f.__name__)
def test_the_kernel_alone(case):
    case(*kernel_classes())

# ---------------------------------------------------------------- each layer on the kernel, alone

def _layered(name):
    "The kernel's classes with the one layer (or layers) of module `aisaac.<name>` added"
    import importlib
    Mixin, Trainer = kernel_classes()
    mod = importlib.import_module(f'aisaac.{name}')
    layers = [o for o in vars(mod).values() if isinstance(o, type) and o.__module__ == mod.__name__
              and not issubclass(o, Mixin) and any(callable(getattr(o, s, None)) and s in vars(o) for s in
              ('must_raise', 'handlers', 'entries', 'callbacks_changed', 'check_callback', 'add_callbacks', 'check_fit', 'start_fit',
               'fit_error', 'end_fit', 'one_pass', 'train_loader', 'summarize_callbacks', 'trace', 'save_checkpoint', 'log', 'one_epoch'))]
    return layers, type('Mixin', (*layers, Mixin), {}), type('Trainer', (*layers, Trainer), {})

LAYER_MODULES = ['compat', 'policy', 'around', 'rewrite', 'declared', 'depends', 'registry', 'plans', 'steps', 'logs', 'ranks', 'checkpoint', 'evals', 'params']

@pytest.mark.parametrize('name', LAYER_MODULES)
def test_the_kernels_tests_pass_with_one_layer_added(name):
    layers, Mixin, Trainer = _layered(name)
    assert layers, f'aisaac.{name} has no layer'
    for case in KERNEL_TESTS: case(Mixin, Trainer)

# ---------------------------------------------------------------- each layer absent

# One fresh Python imports torch and this file (nothing of aisaac: the check below holds it to that), then forks a child per
# layer: the child blocks the layer's module and runs the kernel's tests, so each child is a fresh Python with torch loaded (20
# fresh Pythons, one per layer, took about 130 s on 2 cores; a fork costs milliseconds). A child reports on its own pipe.
_BLOCKS = '''
import os, sys, json, importlib.abc, traceback
sys.path.insert(0, {tests!r})
import torch, torch._dynamo, test_kernel  # (torch._dynamo: the optimizers' first step imports it, 2-3 s, in every child else)
assert not [m for m in sys.modules if m.startswith('aisaac')], sorted(m for m in sys.modules if m.startswith('aisaac'))
class Block(importlib.abc.MetaPathFinder):
    def __init__(self, mod): self.mod = mod
    def find_spec(self, name, path, target=None):
        if name == self.mod: raise ImportError(f"{{name}} is not there in this test")
out = {{}}
for mod in {mods!r}:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            sys.meta_path.insert(0, Block(mod))
            for case in test_kernel.KERNEL_TESTS: case(*test_kernel.kernel_classes())
            left = sorted(m for m in sys.modules if m.startswith('aisaac.') and not m.startswith('aisaac.core'))
            assert mod not in sys.modules and not left, left
            msg, code = f'ok {{len(test_kernel.KERNEL_TESTS)}}', 0
        except BaseException: msg, code = traceback.format_exc(), 1
        os.write(w, msg.encode()); os.close(w); os._exit(code)
    os.close(w)
    with os.fdopen(r, 'rb') as f: msg = f.read().decode()
    _, status = os.waitpid(pid, 0)
    out[mod] = [os.waitstatus_to_exitcode(status), msg]
print(json.dumps(out))
'''

@pytest.fixture(scope='module')
def without_layers():
    "Each layer's module blocked in its own forked child of one fresh Python: {module: [exit code, 'ok N' or the traceback]}"
    code = _BLOCKS.format(mods=[f'aisaac.{n}' for n in LAYERS], tests=str(ROOT/'tests'))
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])

@pytest.mark.parametrize('name', LAYERS)
def test_the_kernels_tests_pass_without_the_layer(name, without_layers):
    rc, msg = without_layers[f'aisaac.{name}']
    assert rc == 0 and msg.startswith('ok'), msg[-3000:]

# ---------------------------------------------------------------- the kernel's size and imports

def _source(mod): return (PKG/'core'/f'{mod}.py').read_text()

def test_the_kernel_is_small():
    "(350 and 20 lines until `add_callbacks` read the taken names once, 3 lines, and the lines were wrapped at 120 characters, 21)"
    sizes = {m: len(_source(m).splitlines()) for m in ('callback', 'dispatch', 'trainer')}
    assert sum(sizes.values()) <= 380, sizes
    from aisaac.core.dispatch import with_cbs
    from aisaac.core.trainer import Trainer
    assert len(inspect.getsource(with_cbs).splitlines()) <= 21
    assert len(inspect.getsource(Trainer).splitlines()) <= 150

def test_the_kernel_imports_nothing_of_aisaac_outside_it():
    for mod in ('callback', 'dispatch', 'trainer'):
        for node in ast.walk(ast.parse(_source(mod))):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 1 or not (node.module or '').startswith('aisaac'), (mod, ast.unparse(node))
            if isinstance(node, ast.Import): assert not any(a.name.startswith('aisaac') for a in node.names), (mod, ast.unparse(node))
    r = subprocess.run([sys.executable, '-c', "import sys, aisaac.core.trainer; print(sorted(m for m in sys.modules if m.startswith('aisaac')))"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.stdout.strip() == "['aisaac', 'aisaac.core', 'aisaac.core.callback', 'aisaac.core.dispatch', 'aisaac.core.trainer']", r.stdout + r.stderr

# ---------------------------------------------------------------- no patches of the kernel's private methods, no imports for side effects

def _modules(): return [p for p in PKG.rglob('*.py') if p.name not in ('_modidx.py', '__init__.py')]

def test_no_private_method_of_the_kernel_is_patched():
    kernel_classes = {'Callback', 'CallbackMixin', 'Trainer', 'with_cbs', 'KernelMixin', 'kernel.Trainer', 'kernel.CallbackMixin'}
    found = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any('patch' in ast.unparse(d) for d in node.decorator_list):
                ann = node.args.args[0].annotation if node.args.args else None
                if ann is not None and ast.unparse(ann) in kernel_classes and node.name.startswith('_'): found.append(f'{p.name}: {node.name}')
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for tt in (t.elts if isinstance(t, ast.Tuple) else [t]):
                        if isinstance(tt, ast.Attribute) and ast.unparse(tt.value) in kernel_classes and tt.attr.startswith('_') \
                           and not tt.attr.startswith('__'): found.append(f'{p.name}: {ast.unparse(tt)}')
    assert not found, found

def test_no_module_is_imported_for_its_side_effect():
    "Every module a module imports gives it names it uses: no `import aisaac.x` kept for what importing it does"
    found = []
    for p in _modules():
        tree = ast.parse(src := p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith('aisaac') and (a.asname or a.name.split('.')[0]) + '.' not in src.replace(ast.unparse(node), ''):
                        found.append(f'{p.name}: {ast.unparse(node)}')
            if isinstance(node, ast.ImportFrom) and node.level and node.module is None:  # `from . import x`: x must be used
                for a in node.names:
                    if p.name != 'all.py' and len(re.findall(rf'\b{a.asname or a.name}\b', src)) < 2: found.append(f'{p.name}: {ast.unparse(node)}')
    assert not found, found

# ---------------------------------------------------------------- what `view_source_code` showed when a notebook was saved is the code

def _shown_sources():
    "(notebook, cell, expression, saved source) of every saved `view_source_code(...)` output"
    for nb in sorted(NBS.rglob('*.ipynb')):
        cells = json.loads(nb.read_text())['cells']
        for i, c in enumerate(cells):
            src = ''.join(c['source'])
            if c['cell_type'] != 'code' or not (m := re.search(r'^view_source_code\((.+)\)\s*$', src, re.M)) or not c.get('outputs'): continue
            out = c['outputs'][0]
            text = out.get('text') or out.get('data', {}).get('text/plain')
            yield nb.relative_to(ROOT).as_posix(), i, m.group(1), ''.join(text) if isinstance(text, list) else text, cells[:i + 1]

def _namespace(cells):
    "The notebook's imports up to the cell, run in a namespace with aisaac's names"
    ns = {}
    exec('from aisaac.all import *', ns)
    for c in cells:
        if c['cell_type'] != 'code': continue
        for line in ''.join(c['source']).splitlines():
            if re.match(r'\s*(from \S+ import|import) ', line) and not line.startswith(' '):
                try: exec(line, ns)
                except Exception: pass
    return ns

SHOWN = list(_shown_sources())

def test_notebooks_show_source_code():
    assert len(SHOWN) >= 8, [s[:3] for s in SHOWN]

@pytest.mark.parametrize('nb, cell, expr, saved, cells', SHOWN, ids=[f'{s[0]}:{s[1]}' for s in SHOWN])
def test_a_saved_view_source_code_output_is_the_code(nb, cell, expr, saved, cells):
    obj = eval(expr, _namespace(cells))
    assert saved.rstrip('\n') == inspect.getsource(obj).rstrip('\n'), f"{nb} cell {cell}: the saved source of {expr} is not the code: run the notebook again"

# ---------------------------------------------------------------- the kernel as the site shows it: short lines, every cell shown

def _kernel_cells():
    "(notebook, cell index, source) of every code cell of the kernel's notebooks"
    for nb in sorted((NBS/'core').glob('*.ipynb')):
        for i, c in enumerate(json.loads(nb.read_text())['cells']):
            if c['cell_type'] == 'code': yield nb.relative_to(ROOT).as_posix(), i, ''.join(c['source'])

def test_the_kernels_lines_are_at_most_120_characters():
    "Longer lines are cut off in the site's code blocks and hard to read in a notebook: the modules and the notebooks' code"
    long = [f'{p.relative_to(ROOT)}:{n}: {len(l)}' for p in sorted((PKG/'core').glob('*.py'))
            for n, l in enumerate(p.read_text().splitlines(), 1) if len(l) > 120]
    long += [f'{nb} cell {i}: {len(l)}' for nb, i, src in _kernel_cells() for l in src.splitlines() if len(l) > 120]
    assert not long, f"{len(long)} kernel lines longer than 120 characters:\n" + '\n'.join(long)

def test_the_kernels_pages_show_its_code():
    "Every exported cell of the kernel is `#| exports`: its code is on the site, as the fastai course's notebooks show theirs"
    hidden = [f'{nb} cell {i}' for nb, i, src in _kernel_cells() if re.match(r'#\|\s*export\s*$', src.splitlines()[0])]
    assert not hidden, f"exported with `#| export`, so the site hides the code: {hidden}"

class _CountedEntries(dict):
    "A callback table that counts how often all of its entries are read"
    reads = 0
    def values(self):
        type(self).reads += 1
        return super().values()

@pytest.mark.parametrize('layered', [False, True], ids=['kernel', 'aisaac'])
def test_adding_many_callbacks_of_one_class_reads_the_taken_names_once(layered):
    "A name for each callback (`Group`, `Group_1`...): the taken names are read once per `add_callbacks`, not once per name tried"
    from aisaac.core.callback import Callback
    if layered: from aisaac.dispatch import CallbackMixin as Mixin
    else: Mixin, _ = kernel_classes()
    class Group(Callback):
        def __init__(self, inner=None): self.callbacks = [inner] if inner else []
    group, depth = None, 300
    for _ in range(depth): group = Group(group)
    box = type('Box', (Mixin,), {})()
    box._entries, _CountedEntries.reads = _CountedEntries(), 0
    box.add_callbacks(group)
    assert len(box.cbs) == depth and box.name_of(group) == 'Group'
    # a layer may ask for one callback's name (`aisaac.guards`): a read per callback, never one per name tried (45,000 here)
    assert _CountedEntries.reads <= (depth + 5 if layered else 5), _CountedEntries.reads
