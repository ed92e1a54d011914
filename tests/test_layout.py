"The layout of the package: the public names stay, modules stay small, and imports go one way only (down the layers)."
import ast, json, pathlib
import aisaac.all

PKG = pathlib.Path(aisaac.all.__file__).parent

# `from aisaac.all import *` before the core was split (issue 9): every one of these names must stay importable.
NAMES_BEFORE_SPLIT = json.loads('''["BasicTrainCB", "Callback", "CallbackMixin", "CallbackSummary", "CancelBackwardException",
 "CancelBatchException", "CancelEpochException", "CancelException", "CancelFitException", "CancelStepException", "CoreCBs",
 "DataLoaders", "DataNotFoundError", "DeviceCB", "F", "GlobalCallbackHandle", "Mean", "MetricsCB", "MomentumTrainCB",
 "MulticlassAccuracy", "OneBatchCB", "ProfileCB", "ProgressCB", "TensorLoader", "Trace", "Trainer", "cache_dir",
 "collate_dict", "conv", "def_device", "default_device", "fashion_classes", "fashion_features", "fashion_mnist_dir",
 "fashion_mnist_hub", "find_idx", "get_model_conv", "hf_offline", "idx_dataset_dict", "inplace", "load_fashion_mnist", "nn",
 "pil_to_tensor", "png_bytes", "read_idx", "register_global_callback", "sample_dataset_dict", "set_seed", "to_cpu",
 "to_device", "to_tensors", "torch", "valid_split", "view_source_code", "with_cbs"]''')

def test_star_import_keeps_every_name():
    ns = {}
    exec('from aisaac.all import *', ns)
    missing = [n for n in NAMES_BEFORE_SPLIT if n not in ns]
    assert not missing, f"names no longer importable from aisaac.all: {missing}"
    assert set(aisaac.all.__all__) <= set(ns)

def _modules():
    "Every generated module, as its dotted name under `aisaac`"
    return {'.'.join(p.relative_to(PKG).with_suffix('').parts): p for p in PKG.rglob('*.py')
            if p.name not in ('__init__.py', '_modidx.py')}

def test_no_module_over_400_lines():
    sizes = {name: len(p.read_text().splitlines()) for name, p in _modules().items()}
    assert max(sizes.values()) <= 400, {k: v for k, v in sizes.items() if v > 400}

def _imports(path, name):
    "The aisaac modules that module `name` (at `path`) imports"
    pkg = name.split('.')[:-1]
    res = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = pkg[:len(pkg) - node.level + 1] if node.level else []
            mod = '.'.join(base + ([node.module] if node.module else [])) if node.level else (node.module or '')
            if not node.level and not mod.startswith('aisaac'): continue
            mod = mod.removeprefix('aisaac.').removeprefix('aisaac')
            for a in node.names:  # `from . import x` or `from .callbacks import train` import modules
                sub = f'{mod}.{a.name}' if mod else a.name
                res.add(sub if sub in _modules() else mod)
        elif isinstance(node, ast.Import):
            res |= {a.name.removeprefix('aisaac.') for a in node.names if a.name.startswith('aisaac.')}
    return res - {''}

def test_imports_go_down_the_layers():
    "The order of `aisaac.all._modules` is the order of the layers: a module imports only modules listed before it"
    order = [m.__name__.removeprefix('aisaac.') for m in aisaac.all._modules]
    mods = _modules()
    assert set(order) | {'all'} == set(mods), f"modules missing from aisaac.all._modules: {set(mods) - set(order) - {'all'}}"
    for i, name in enumerate(order):
        above = set(order[i:]) & _imports(mods[name], name)
        assert not above, f"aisaac.{name} imports {above}, which are not below it"
