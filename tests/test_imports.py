"""What `import aisaac.all` imports (issue 47): none of the libraries that only some users need (matplotlib, `datasets`,
`torch.distributed.checkpoint`, fastprogress, transformers, the trackers...), which are imported at their first use and
work then; and the star import leaves a user's own model names alone (issue 46). `bench/imports.py` times it."""
import json, os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAZY = ['matplotlib', 'datasets', 'pandas', 'pyarrow', 'torch.distributed.checkpoint', 'torch.distributed.tensor', 'fastprogress',
        'transformers', 'tensorboard', 'mlflow', 'wandb', 'accelerate', 'onnx', 'tokenizers', 'peft', 'torchdata']

# One fresh Python serves every check: what the import brought, then each lazy part used once
CODE = f"""
import json, sys
LAZY = {LAZY!r}
res = {{}}
import aisaac.all
res['import'] = [m for m in LAZY if m in sys.modules]
ns = {{}}
exec('from aisaac.all import *', ns)
res['star'] = [m for m in LAZY if m in sys.modules]
res['names'] = sorted(ns)
import torch
from torch import nn
from aisaac.dcp import is_sharded, state_dicts
res['is_sharded'] = is_sharded(nn.Linear(2, 2))
res['dtensor_before'] = 'torch.distributed.tensor' in sys.modules  # the check imported nothing
msd, _ = state_dicts(nn.Linear(2, 2), by_name=True)  # torch.distributed.checkpoint's get_state_dict
res['dcp'] = sorted(msd), 'torch.distributed.checkpoint' in sys.modules
from aisaac.plot import show_images
import inspect
res['signature'] = 'cmap' in inspect.signature(show_images).parameters and 'sharex' in inspect.signature(show_images).parameters
fig = show_images(torch.zeros(2, 1, 4, 4)); res['plot'] = type(fig).__name__ if fig is not None else None, 'matplotlib' in sys.modules
import aisaac.data as data
ds = data.Dataset.from_dict({{'label': [1, 2]}})
res['datasets'] = type(ds).__module__.split('.')[0], 'datasets' in sys.modules, isinstance(ds, data.Dataset)
res['features'] = data.fashion_features == data.Features({{'image': data.Image(), 'label': data.ClassLabel(names=data.fashion_classes)}})
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, TensorLoader
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.progress import ProgressCB
x = torch.randn(8, 2)
Trainer(DataLoaders(TensorLoader(x, x, bs=4), TensorLoader(x, x, bs=4)), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 2),
        callbacks=[BasicTrainCB(), ProgressCB(bars=True)]).fit(1)
res['progress'] = 'fastprogress' in sys.modules
print(json.dumps(res))
"""

def test_the_import_brings_no_library_only_some_users_need_and_each_imports_at_its_first_use():
    env = {**os.environ, 'MPLBACKEND': 'Agg', 'PYTHONPATH': os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))}
    p = subprocess.run([sys.executable, '-c', CODE], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res['import'] == [] and res['star'] == [], res  # before: matplotlib, datasets, pandas, pyarrow, torch.distributed.checkpoint...
    import aisaac.all
    assert set(aisaac.all.__all__) <= set(res['names'])  # the star import gives every name of `__all__`
    assert res['is_sharded'] is False and res['dtensor_before'] is False
    assert res['dcp'] == [['bias', 'weight'], True]
    assert res['signature'] is True  # the parameters show_images passes on to matplotlib, read when asked for
    assert res['plot'][1] is True
    assert res['datasets'] == ['datasets', True, True] and res['features'] is True
    assert res['progress'] is True

def test_the_star_import_leaves_a_users_model_names_alone():
    "nanoGPT: `from model import GPT, GPTConfig` then `from aisaac.all import *` gave aisaac's GPT, and `GPT(GPTConfig(...))` a TypeError in nn.Embedding"
    ns = {'GPT': 'theirs', 'GPTConfig': 'theirs', 'CausalSelfAttention': 'theirs', 'Block': 'theirs', 'MLP': 'theirs', 'LayerNorm': 'theirs'}
    exec('from aisaac.all import *', ns)
    assert {k: ns[k] for k in ('GPT', 'GPTConfig', 'CausalSelfAttention', 'Block', 'MLP', 'LayerNorm')} == dict.fromkeys(
        ('GPT', 'GPTConfig', 'CausalSelfAttention', 'Block', 'MLP', 'LayerNorm'), 'theirs')
    assert 'GPTBlock' not in ns and 'Trainer' in ns and 'get_model_gpt' in ns
    from aisaac.models import GPT, GPTBlock, CausalSelfAttention  # aisaac's, from their module
    assert isinstance(GPT(32, n_layer=1, n_head=1, d_model=8, block_size=4).blocks[0].attn, CausalSelfAttention)
