"""`nbdev-test`, with the longest notebooks started first: the Makefile's `nbtest` runs this in its place, with the same options.

nbdev-test hands the notebooks to its workers in the order of their paths, which puts the tutorials, the longest by far, last:
on 2 workers one of them then ran the last two alone (in `make test-fast`, 200 s for 348 s of notebooks, where 174 s is the
least two workers can take). Started first, the others fill the time beside them. Every notebook still runs, with nbdev's own
runner (`nbdev.test.nbdev_test`): only the order changes.

A worker runs its notebooks one after the other in one Python, so what one changes in the process stays for the next: a
tutorial's `warnings.filterwarnings('ignore', ...)` silenced the warning a later notebook's `test_warns` checks (34_sft failed
after post_training). Each notebook now runs inside `warnings.catch_warnings()`: it starts with the filters as they were."""
import builtins, sys, warnings
import nbdev.test

# The notebooks (file names) that took longest in `make nbtest` on the 2-core machine, longest first (seconds, one thread, quiet):
# language_model 56, fine_tuning 44, post_training 39, vision 14, 33_text 7, 62_trackers 7. The rest follow in nbdev's order.
FIRST = ['language_model.ipynb', 'fine_tuning.ipynb', 'post_training.ipynb', 'vision.ipynb', '33_text.ipynb', '62_trackers.ipynb']

def longest_first(files):
    "`files` (paths) in nbdev's order, but those named in `FIRST` first, in its order"
    rank = {name: i for i, name in enumerate(FIRST)}
    return builtins.sorted(builtins.sorted(files), key=lambda f: rank.get(f.name, len(FIRST)))

def _sorted(items, **kw):
    "nbdev.test's `sorted`: its file list (the one call without a key) longest first; its timings' (with a key) as the builtin"
    return builtins.sorted(items, **kw) if kw else longest_first(items)

def isolated_test_nb(*args, **kwargs):
    "nbdev's `test_nb` with the warning filters (and the once-only registries) put back after the notebook"
    with warnings.catch_warnings(): return _test_nb(*args, **kwargs)
_test_nb = nbdev.test.test_nb

def install():
    "Make nbdev_test start the longest notebooks first and run each with its own warning filters"
    nbdev.test.sorted = _sorted  # a module global shadows the builtin for nbdev.test's own calls
    nbdev.test.test_nb = isolated_test_nb  # what nbdev_test hands to its workers: pickled by reference to this module, `nbtest`
    # (not to `__main__`, which IPython replaces in a worker once it has run a notebook)

if __name__ == '__main__':
    import nbtest  # this file as a module of its own name, so that the workers find `isolated_test_nb` there
    nbtest.install()
    sys.exit(nbdev.test.nbdev_test())
