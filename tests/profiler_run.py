"""Two CPU processes (torchrun, gloo, DistributedDataParallel) that each profile a fit, for tests/test_profiler.py:

    torchrun --standalone --nproc_per_node 2 profiler_run.py OUT fit

Each process trains on its own half of the data under `TorchProfilerCB(OUT/'traces', wait=1, warmup=1, active=2)` and writes
OUT/result_<rank>.json: its rank and the paths of the traces it wrote."""
import datetime, json, sys
from pathlib import Path
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torcheval.metrics import MulticlassAccuracy
from aisaac.data import TensorLoader
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.introspect import TorchProfilerCB

def main(out:Path, case:str):
    torch.set_num_threads(1)
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(48, 4, generator=g), torch.randint(0, 3, (48,), generator=g)
    dls = type('DLs', (), {'train': TensorLoader(x, y, bs=8), 'valid': TensorLoader(x[:8], y[:8], bs=8)})()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 3))
    p = TorchProfilerCB(out/'traces', wait=1, warmup=1, active=2, row_limit=0)
    Trainer(dls, nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[BasicTrainCB(), MetricsCB(Accuracy=MulticlassAccuracy())]).fit(1, callbacks=p)
    (out/f'result_{rank}.json').write_text(json.dumps({'rank': rank, 'paths': [str(f) for f in p.paths]}))
    dist.destroy_process_group()

if __name__ == '__main__': main(Path(sys.argv[1]), sys.argv[2])
