"pytest settings for the whole suite."
import functools, inspect, os, re
import torch

# The models in the tests are tiny: one thread is faster than torch's default on a small, shared CPU (two threads per
# process thrash when several processes run), and makes CPU results reproducible from run to run.
torch.set_num_threads(1)
# The same for the processes the tests start (fresh Pythons, torchrun's, Jupyter kernels), unless the environment says otherwise:
# with torch's default of 2 threads beside pytest-xdist's other worker, the 2 cores were oversubscribed and OpenMP's waiting threads
# thrashed (the first tutorial in a kernel: 137 s against 11 s with 1 thread).
os.environ.setdefault('OMP_NUM_THREADS', '1')

# Tests marked `cuda` (tests/test_cuda.py) need a GPU: skipped, with the reason, where torch sees none.
_NO_GPU = ("needs a CUDA GPU and torch.cuda.is_available() is False here: run `pytest -m cuda tests/test_cuda.py -rs` "
           "on a machine with one (bench/README.md, 'On a GPU')")

# Tests that start other processes (torchrun, a fresh Python, a Jupyter kernel) are marked `slow`: each pays for starting
# Python and importing torch. `make test` runs them all; `make test-fast` (`pytest -m "not slow"`) leaves them out.
_STARTS = re.compile(r'\b(?:subprocess|Popen|launch|run_script|run_nbs\.run|rerun|start_new_kernel|torch\.distributed\.run|torchrun_cases|spawn)\b')

# Tests that run 2 processes at once (torchrun, a 2-process chaos trial) need both cores: marked `serial`, they run one at a time
# after the others, which `make pytest` runs on both cores with pytest-xdist (`-n 2`). `@pytest.mark.serial` marks others by hand.
# Every serial test is also `slow`, so `make test-fast` has no serial pass to run.
_TWO = re.compile(r"torch\.distributed\.run|torchrun_cases|nproc_per_node|'--procs', '2'")

@functools.lru_cache(maxsize=None)
def _source(fn):
    "`fn`'s source and the names it calls, read once (collection asks for each test function and fixture of 1,700 items)"
    try: src = inspect.getsource(fn)
    except (OSError, TypeError): return None, ()
    return src, tuple(sorted(set(re.findall(r'\b(\w+)\(', src))))

@functools.lru_cache(maxsize=None)
def _starts(fn, module, pattern):
    "`_starts_processes` for a test function or fixture: its answer depends on nothing else, so it is worked out once per function"
    return _starts_processes(fn, module, set(), pattern)

def _starts_processes(fn, module, seen, pattern=_STARTS):
    "Whether `fn`, or a function of its test module that it calls (at any depth), has code that `pattern` finds (starts a process)"
    src, called = _source(fn)
    if src is None: return False
    if pattern.search(src): return True
    for name in set(called) - seen:
        seen.add(name)
        f = getattr(module, name, None)
        if inspect.isfunction(f) and f.__module__ == module.__name__ and _starts_processes(f, module, seen, pattern): return True
    return False

def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: starts other processes (torchrun, a fresh Python, a Jupyter kernel); `make test-fast` leaves it out')
    config.addinivalue_line('markers', 'serial: runs 2 processes at once (torchrun), or depends on having the cores to itself; '
                                       '`make pytest` runs these one at a time after the others')
    config.addinivalue_line('markers', 'torchrun_cases(*names): the cases of its module\'s `torchrun_cases.Cases` a test reads (tests/torchrun_cases.py)')

def pytest_collection_modifyitems(config, items):
    import pytest
    for item in items:
        fixtures = [d.func for ds in getattr(getattr(item, '_fixtureinfo', None), 'name2fixturedefs', {}).values() for d in ds]
        fns = [getattr(f, '__wrapped__', f) for f in [item.function, *fixtures]]
        if any(_starts(f, item.module, _STARTS) for f in fns): item.add_marker(pytest.mark.slow)
        if any(_starts(f, item.module, _TWO) for f in fns): item.add_marker(pytest.mark.serial)
        if 'serial' in item.keywords and 'slow' not in item.keywords: item.add_marker(pytest.mark.slow)  # (a test that needs both cores is no quick one: `make test-fast` runs no serial pass)
    if torch.cuda.is_available(): return
    skip = pytest.mark.skip(reason=_NO_GPU)
    for item in items:
        if 'cuda' in item.keywords: item.add_marker(skip)
