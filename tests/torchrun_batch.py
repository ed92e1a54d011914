"""Several cases of a torchrun test script in one launch, for tests/torchrun_cases.py's `Cases`:

    torchrun --standalone --nproc_per_node 2 torchrun_batch.py PLAN

PLAN is a JSON file of a list of `[SCRIPT, OUT, CASE, OPTION...]`: each process runs each SCRIPT as `__main__` with the rest as its
arguments in turn, as a launch of its own would, in one process group: the script's `init_process_group` makes the group the
first time only, and its `destroy_process_group` keeps it for the next case (it is destroyed at the end). Python, torch and aisaac are
imported once, and torchrun starts once, for all the cases (of several scripts). A case that raises writes its traceback to OUT/batch_error_<rank>.txt
and the next case runs; the processes meet at a barrier between cases."""
import json, os, runpy, sys, traceback
from pathlib import Path
import torch.distributed as dist

_init, _destroy = dist.init_process_group, dist.destroy_process_group

def init_once(*args, **kwargs):
    "`init_process_group`, the first time; afterwards the group is there already"
    if not dist.is_initialized(): _init(*args, **kwargs)

def keep_default(group=None):
    "`destroy_process_group`, but of the default group: that one serves the next case"
    if group is not None: _destroy(group)

if __name__ == '__main__':
    plan = json.loads(Path(sys.argv[1]).read_text())
    dist.init_process_group, dist.destroy_process_group = init_once, keep_default
    rank = int(os.environ['RANK'])
    for script, *args in plan:
        sys.argv = [script, *args]
        try: runpy.run_path(script, run_name='__main__')
        except SystemExit as e:
            if e.code not in (None, 0): (Path(args[0])/f'batch_error_{rank}.txt').write_text(f'SystemExit({e.code!r})')
        except BaseException: (Path(args[0])/f'batch_error_{rank}.txt').write_text(traceback.format_exc())
        if dist.is_initialized(): dist.barrier()
    if dist.is_initialized(): _destroy()
