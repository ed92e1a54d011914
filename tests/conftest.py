"pytest settings for the whole suite."
import torch

# The models in the tests are tiny: one thread is faster than torch's default on a small, shared CPU (two threads per
# process thrash when several processes run), and makes CPU results reproducible from run to run.
torch.set_num_threads(1)

# Tests marked `cuda` (tests/test_cuda.py) need a GPU: skipped, with the reason, where torch sees none.
_NO_GPU = ("needs a CUDA GPU and torch.cuda.is_available() is False here: run `pytest -m cuda tests/test_cuda.py -rs` "
           "on a machine with one (bench/README.md, 'On a GPU')")

def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available(): return
    import pytest
    skip = pytest.mark.skip(reason=_NO_GPU)
    for item in items:
        if 'cuda' in item.keywords: item.add_marker(skip)
