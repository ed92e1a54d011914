"""A Fashion-MNIST run with AccelerateCB, for tests/test_accel.py and bench/accel.py; launch it on N processes with

    torchrun --standalone --nproc_per_node N accel_run.py OUT N_TRAIN N_VALID EPOCHS

Each process writes OUT/result_<rank>.pt (its weights and buffers, history, fit time) and OUT/stdout_<rank>.txt (what it printed);
the main process alone writes the checkpoints in OUT/ckpt, the log OUT/log.txt and its loggers' files OUT/epochs_0.csv and
OUT/log_0.jsonl (each process would name its own: none but rank 0 may make one); OUT/writes_<rank>.txt lists the files each
process's checkpoint engine wrote.
"""
import os, sys, time
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torcheval.metrics import MulticlassAccuracy
from aisaac.utils import set_seed
from aisaac.models import conv, get_model_conv
from aisaac.core.callback import Callback
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders, load_fashion_mnist, sample_dataset_dict, to_tensors
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.progress import ProgressCB
from aisaac.callbacks.savers import CheckpointCB
from aisaac.callbacks.accel import AccelerateCB
from aisaac.callbacks.loggers import CSVLogger, JSONLinesLogger

def data(n_train, n_valid, bs=32):
    "Shuffled training and plain validation `DataLoader`s over a Fashion-MNIST sample"
    dsd = sample_dataset_dict(load_fashion_mnist(), n_train=n_train, n_valid=n_valid)
    (x, y), (xv, yv) = to_tensors(dsd['train']), to_tensors(dsd['test'])
    return DataLoaders(DataLoader(TensorDataset(x, y), bs, shuffle=True), DataLoader(TensorDataset(xv, yv), bs))

def make_model():
    "The course's conv net with a batch norm after its first layer (buffers that each process updates)"
    return nn.Sequential(conv(1, 8), nn.BatchNorm2d(8), *get_model_conv(nfs=(8, 16, 32, 64)))

class LogFile(Callback):
    "Writes each epoch's row to `path`: a log that only the main process keeps"
    main_process_only = True
    def __init__(self, path): self.path = path
    def log_metrics(self, trainer, metrics):
        "Append the row"
        with open(self.path, 'a') as f: f.write(f'{os.environ.get("RANK", "0")} {metrics}\n')

class RecordWrites:
    "A checkpoint engine callback that lists the files this process wrote"
    def __init__(self, path): self.path = path
    def after_save(self, engine, return_value):
        with open(self.path, 'a') as f: f.write(f'{return_value}\n')

if __name__ == '__main__':
    out, n_train, n_valid, epochs = Path(sys.argv[1]), *map(int, sys.argv[2:5])
    rank = int(os.environ.get('RANK', '0'))
    sys.stdout = open(out/f'stdout_{rank}.txt', 'w', buffering=1)
    set_seed(0)
    trainer = Trainer(data(n_train, n_valid), nn.CrossEntropyLoss(), torch.optim.Adam, make_model(),
                      callbacks=[AccelerateCB(), MetricsCB(acc=MulticlassAccuracy()), ProgressCB(bars=False),
                                 CheckpointCB(out/'ckpt'), LogFile(out/'log.txt'),
                                 CSVLogger(out/f'epochs_{rank}.csv'), JSONLinesLogger(out/f'log_{rank}.jsonl')])  # per-rank paths
    trainer.checkpoint_engine.add_callbacks(RecordWrites(out/f'writes_{rank}.txt'))
    start = time.perf_counter()
    trainer.fit(epochs, lr=2e-3)
    fit_time = time.perf_counter() - start
    trainer.save_checkpoint(out/'final.pt')  # called on every process, written by the main one
    torch.save({'state': trainer.model.state_dict(), 'history': trainer.history.state_dict(), 'fit_time': fit_time,
                'processes': trainer.AccelerateCB.acc.num_processes}, out/f'result_{rank}.pt')
