"""A `DistributedSampler(shuffle=True)` orders each epoch by the epoch it is told (`set_epoch`): the trainer tells it the clock's count
of the loader's epochs, so each epoch has its own order (before, every epoch had epoch 0's), in a run of epochs and in one measured
in steps, and a resumed run takes the batches the uninterrupted one took."""
import types
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.savers import CheckpointCB

class Seen(Callback):
    "The training batches, as the numbers of their samples"
    def __init__(self): self.batches = []
    def after_dataloader(self, t):
        if t.model.training: self.batches.append(t.batch[0][:, 0].long().tolist())

def trainer(*cbs):
    "A linear model on 16 numbered samples, batches of 4 from a `DistributedSampler` of one process (no process group needed)"
    x = torch.arange(16.).unsqueeze(1).repeat(1, 2)
    ds = TensorDataset(x, x[:, :1])
    dl = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0))
    torch.manual_seed(0)
    seen = Seen()
    return Trainer(types.SimpleNamespace(train=dl, valid=[]), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1),
                   callbacks=[BasicTrainCB(), seen, *cbs]), seen

def epochs(batches, n=4): return [sorted(sum(batches[i:i + n], [])) for i in range(0, len(batches), n)], [batches[i:i + n] for i in range(0, len(batches), n)]

def test_each_epoch_of_a_distributed_sampler_has_its_own_order_and_a_resume_takes_the_same_batches(tmp_path):
    t, seen = trainer(CheckpointCB(tmp_path, every_n_epochs=None, every_n_batches=2, keep_last=None))
    t.fit(2, lr=1e-3, valid=False)
    t.fit(1, lr=1e-3, valid=False)  # a second fit goes on with the next order
    whole, orders = epochs(seen.batches)
    assert whole == [list(range(16))] * 3  # every epoch, every sample once
    assert orders[0] != orders[1] and orders[1] != orders[2] and orders[0] != orders[2]
    r, rseen = trainer()
    r.fit(2, lr=1e-3, valid=False, resume_from=tmp_path/'checkpoint_0001_000002.pt')  # after 2 batches of epoch 1
    assert rseen.batches == seen.batches[6:8]

def test_a_run_measured_in_steps_gives_each_epoch_of_the_loader_its_own_order_and_resumes_inside_one(tmp_path):
    t, seen = trainer(CheckpointCB(tmp_path, every_n_epochs=None, every='2 steps', keep_last=None))
    t.fit(steps=10, valid_every=5, lr=1e-3, valid=False)
    _, orders = epochs(seen.batches)
    assert len(seen.batches) == 10 and orders[0] != orders[1]
    r, rseen = trainer()
    r.fit(steps=10, valid_every=5, lr=1e-3, valid=False, resume_from=tmp_path/'checkpoint_step_000006.pt')  # in the loader's 2nd epoch
    assert rseen.batches == seen.batches[6:]
