"""Two CPU processes (torchrun, gloo, DistributedDataParallel) where one process alone sees a loss spike, for tests/test_spikes.py:

    torchrun --standalone --nproc_per_node 2 spikes_run.py OUT CASE

CASE 'skip': rank 1's loss of its batch 6 is multiplied by 10,000 (LossSpikeCB('skip')): both processes must skip that step.
CASE 'rollback': rank 0's loss of batch 9 (LossSpikeCB('rollback', check_every=4, snapshot_every=4)): both must roll back to the
state after batch 7 (the clean check of step 8; the spike is read at step 12), with the learning rate halved.
CASE 'resume': the 'rollback' run writing a checkpoint every 2 batches, then resumed on both processes from the one written after batch
10 (between the spike and the check that reads it): the weights must be the uninterrupted run's. Each process writes OUT/result_<rank>.json.
"""
import datetime, json, sys, types
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.spikes import LossSpikeCB
from aisaac.callbacks.savers import CheckpointCB

class Spike(Callback):
    "On process `rank` only, multiply the loss of training batch `batch` by 10,000"
    order = -1
    def __init__(self, rank, batch): self.rank, self.batch = rank, batch
    def after_loss(self, t):
        if t.model.training and t.batch_num == self.batch and dist.get_rank() == self.rank: t.loss = t.loss * 1e4

class Watch(Callback):
    "The skips' reasons, and the weights at the end of each training batch"
    order = 60
    def before_fit(self, t): self.skips, self.at = [], {}
    def step_skipped(self, t, reason): self.skips.append(reason)
    def checkpoint(self, t, at):
        if at == 'batch': self.at[t.batch_num] = torch.cat([p.detach().flatten() for p in t.model.parameters()]).clone()

if __name__ == '__main__':
    out, case = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)  # each process its own batches of one line
    w = torch.arange(4.).unsqueeze(1) / 4
    xs = [torch.randn(8, 4, generator=g) for _ in range(16)]
    dls = types.SimpleNamespace(train=[(x, x @ w) for x in xs], valid=[])
    def run(**kw):
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Linear(4, 1))
        spikes = LossSpikeCB('skip', warmup=3) if case == 'skip' else LossSpikeCB('rollback', warmup=3, check_every=4, snapshot_every=4)
        saves = [CheckpointCB(out/('a' if not kw else 'b'), every_n_batches=2, keep_last=None)] if case == 'resume' else []
        trainer = Trainer(dls, nn.MSELoss(), torch.optim.SGD, model,
                          callbacks=[BasicTrainCB(), spikes, watch := Watch(), Spike(1 if case == 'skip' else 0, 6 if case == 'skip' else 9), *saves])
        trainer.fit(1, lr=0.1, valid=False, **kw)
        return trainer, model, spikes, watch
    trainer, model, spikes, watch = run()
    res = {'steps': trainer.clock.step, 'weights': torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),
           'skips': watch.skips, 'events': [e['action'] for e in spikes.events], 'lr': trainer.opt.param_groups[0]['lr'],
           'back_to_snapshot': case != 'skip' and bool(torch.equal(watch.at[11], watch.at[7]))}
    if case == 'resume':
        trainer, model, spikes, watch = run(resume_from=out/'a'/'checkpoint_0000_000010.pt')
        res['resumed'] = {'weights': torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),
                          'events': [e['action'] for e in spikes.events], 'skipped': spikes.skipped}
    (out/f'result_{rank}.json').write_text(json.dumps(res))
    dist.destroy_process_group()
