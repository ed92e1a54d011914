"""Post-training runs on 2 CPU processes (torchrun, gloo, DistributedDataParallel), for tests/test_chunked.py, tests/test_preference.py and
tests/test_distill.py:

    torchrun --standalone --nproc_per_node 2 posttrain_run.py OUT CASE

Each process trains its share of each step's data and writes OUT/result_<rank>.json: the loss of each of its batches, the gradient's
norm at each step (after DistributedDataParallel's averaging: the same on both), and its weights at the end. The cases' builders are
here too, so that the tests make the one-process run from the same code.
"""
import json, sys
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders
from aisaac.models import GPT, lm_loss
from aisaac.callbacks.gradients import GradAccumCB

class Record(Callback):
    "Each training batch's loss, and the gradients' total norm at each optimizer step (after `GradAccumCB` has weighed them)"
    order = 50
    def __init__(self): self.losses, self.norms = [], []
    def after_loss(self, trainer):
        if trainer.model.training: self.losses.append(trainer.loss.item())
    def before_step(self, trainer):
        self.norms.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]).norm().item())

def tiny_gpt(seed=0, vocab=50):
    "A GPT of 2 layers of 16, a vocabulary of 50 and a context of 48, seeded"
    torch.manual_seed(seed)
    return GPT(vocab, n_layer=2, n_head=2, d_model=16, block_size=48)

def chunked_batches():
    "4 micro-batches of 2 rows of 12 tokens, shifted labels with a masked prompt; the third (rank 1's first) masked throughout"
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(4):
        ids = torch.randint(0, 50, (2, 13), generator=g)
        labels = ids[:, 1:].clone(); labels[:, :3 + i] = -100
        if i == 2: labels[:] = -100
        out.append({'input_ids': ids[:, :-1], 'labels': labels})
    return out

def fit(model, batches, cbs, n_accum, lr=0.5):
    "One optimizer step per `n_accum` batches, SGD; the recorder"
    rec = Record()
    t = Trainer(DataLoaders(batches, batches[:1]), lm_loss, torch.optim.SGD, model, callbacks=[*cbs, GradAccumCB(n_accum), rec])
    t.fit(1, lr=lr, valid=False)
    return rec

def weights(model): return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()

if __name__ == '__main__':
    out, case = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group('gloo')
    rank = dist.get_rank()
    if case == 'chunked':
        from aisaac.callbacks.chunked import ChunkedLossCB
        model = nn.parallel.DistributedDataParallel(tiny_gpt())
        rec = fit(model, chunked_batches()[2 * rank:2 * rank + 2], [ChunkedLossCB(chunk=8)], 2)
        res = {'losses': rec.losses, 'norms': rec.norms, 'weights': weights(model.module)}
    else:
        import posttrain_cases
        res = posttrain_cases.run(case, rank)
    (out/f'result_{rank}.json').write_text(json.dumps(res))
    dist.destroy_process_group()
