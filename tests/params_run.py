"""Parameter groups and freezing on 2 CPU processes (torchrun, gloo), for tests/test_params.py:

    torchrun --standalone --nproc_per_node 2 params_run.py OUT CASE

CASE 'fine_tune': `fine_tune(1, base_lr=1e-2)` of tests/sharding_run.py's tiny GPT under `FSDPCB` (AdamW: groups without weight decay,
rates spread over the GPT's layer groups; frozen, then unfrozen after the model was sharded). Each process writes OUT/result_<rank>.json:
the mean loss of both processes at each step, the whole weights after, the optimizer's groups and which parameters trained in each fit.
CASE 'ddp': the model wrapped in DistributedDataParallel: `freeze()` is refused; each process writes the error.
`fine_tune_losses` also runs the single-process reference of the test.
"""
import datetime, json, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.models import lm_loss
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.sharding import FSDPCB
import aisaac.callbacks.schedule  # (adds `Trainer.fine_tune`)
from sharding_run import make_model, loaders, full_weights, Record

class Seen(Callback):
    "The optimizer's groups (names and peak rates) and how many parameters train, at the start of each fit (after FSDPCB made the optimizer)"
    order = 10
    def __init__(self): self.fits = []
    def before_fit(self, trainer):
        self.fits.append({'groups': [[g.get('name'), g.get('no_decay', False), round(g['max_lr'], 10)] for g in trainer.opt.param_groups],
                          'trains': sum(p.requires_grad for p in trainer.model.parameters())})

def fine_tune_losses(world=1):
    "fine_tune of the tiny GPT, FSDPCB on `world` processes: the losses of every step (both processes' mean), the whole weights, what each fit saw"
    model, rec, seen = make_model(), Record(), Seen()
    t = Trainer(loaders(world), lm_loss, torch.optim.AdamW, model, callbacks=[BasicTrainCB(), rec, seen, *([FSDPCB()] if world > 1 else [])])
    t.fine_tune(1, base_lr=1e-2)
    losses = torch.stack([l.float() for l in rec.losses])
    if world > 1: dist.all_reduce(losses); losses /= world
    return {'losses': losses.tolist(), 'weights': full_weights(model), 'fits': seen.fits,
            'param_type': type(next(model.parameters())).__name__}

def run_ddp():
    model = nn.parallel.DistributedDataParallel(make_model())
    t = Trainer(loaders(2), lm_loss, torch.optim.AdamW, model, callbacks=[BasicTrainCB()])
    try: t.freeze()
    except Exception as e: return {'error': f'{type(e).__name__}: {e}'}
    return {'error': None}

if __name__ == '__main__':
    out, case = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    rank, start = dist.get_rank(), time.time()
    res = fine_tune_losses(2) if case == 'fine_tune' else run_ddp()
    res.update(rank=rank, seconds=time.time() - start)
    (out/f'result_{rank}.json').write_text(json.dumps(res))
    dist.destroy_process_group()
