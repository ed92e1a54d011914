#!/usr/bin/env python
"""Start a training command again each time it fails, until it ends: the outer restart loop of a run that resumes itself.

    python scripts/relaunch.py --max-restarts 3 --dir ckpt -- torchrun --standalone --nproc_per_node 2 train.py
    python scripts/relaunch.py --max-restarts 3 --dir ckpt -- python train.py

The command is a script whose fit resumes from the newest whole checkpoint, if there is one:

    trainer.fit(10, callbacks=[CheckpointCB('ckpt', every='200 steps')], resume_from=last_checkpoint('ckpt'))

When the command exits with an error (a process killed, a node lost, a failed step), it is started again, up to
`--max-restarts` times, and goes on from there; it ends the loop when it exits with 0. With `--dir` (the folder the
checkpoints go to), each start says which checkpoint it resumes from, and a start that ended with no newer checkpoint
than it began from ends the loop: a failure that a restart does not cure is not retried forever.

Why not torchrun's own `--max-restarts`: on torch 2.13 the processes torchrun restarts in a gloo job never get past
`init_process_group` (gloo reaches for the first attempt's addresses: `Gloo connectFullMesh failed ... Connection
refused`, or it waits until killed); a plain PyTorch script does the same. Starting torchrun itself again gives each
attempt a fresh rendezvous. The exit code is the command's last one.
"""
import argparse, subprocess, sys, time
from pathlib import Path

def newest(dir):
    "The newest whole checkpoint in `dir` (aisaac's `last_checkpoint`: the one the script resumes from), or None"
    if dir is None or not Path(dir).exists(): return None
    from aisaac.callbacks.savers import last_checkpoint
    return last_checkpoint(dir)

def relaunch(cmd:list, # the command and its arguments
             max_restarts:int=3, # starts after the first one, at most
             dir=None, # the checkpoints' folder: report the resume point, stop when a start made no progress
             say=print): # where the lines about each start go
    "Run `cmd` until it exits with 0, starting it again after a failure (at most `max_restarts` times); its last exit code"
    for attempt in range(max_restarts + 1):
        start = newest(dir)
        say(f">>> relaunch: start {attempt + 1} of at most {max_restarts + 1}" + (f", from {Path(start).name}" if start else '')
            + f": {' '.join(cmd)}")
        t0 = time.perf_counter()
        rc = subprocess.run(cmd).returncode
        if rc == 0:
            say(f">>> relaunch: the run ended after {attempt + 1} start(s) ({time.perf_counter() - t0:.0f} s for the last)")
            return 0
        if dir is not None and newest(dir) == start:
            say(f">>> relaunch: exit code {rc}, and no newer checkpoint than the start's: not started again")
            return rc
        say(f">>> relaunch: exit code {rc} after {time.perf_counter() - t0:.0f} s")
    say(f">>> relaunch: gave up after {max_restarts} restart(s)")
    return rc

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--max-restarts', type=int, default=3, help='starts after the first one, at most (default %(default)s)')
    p.add_argument('--dir', help='the folder the checkpoints go to: say where each start resumes, stop when one made no progress')
    p.add_argument('cmd', nargs=argparse.REMAINDER, help='the training command, after --')
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ['--'] else a.cmd
    if not cmd: p.error('give the command to run after --')
    sys.exit(relaunch(cmd, a.max_restarts, a.dir, say=lambda s: print(s, flush=True)))
