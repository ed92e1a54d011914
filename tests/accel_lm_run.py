"""A language-model run with AccelerateCB on dict batches, for tests/test_accel.py; launch it on N processes with

    torchrun --standalone --nproc_per_node N accel_lm_run.py OUT

Each process writes OUT/result_<rank>.pt: its weights and its history.
"""
import os, sys
from pathlib import Path
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torcheval.metrics.text import Perplexity
from aisaac.utils import set_seed
from aisaac.trainer import Trainer
from aisaac.data import DataLoaders
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.accel import AccelerateCB

V, T = 40, 12

class Blocks(Dataset):
    "Token blocks as dicts: `labels` are the next tokens, every other one following from the one before"
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, V, (n, T + 1), generator=g)
        ids[:, 1::2] = (ids[:, ::2][:, :ids[:, 1::2].shape[1]] * 3) % V
        self.ids = ids
    def __len__(self): return len(self.ids)
    def __getitem__(self, i): return {'input_ids': self.ids[i, :-1], 'labels': self.ids[i, 1:]}

def data(bs=8):
    "A shuffled training loader and a validation loader of 50 blocks: 4 batches of 8 per process on 2, the last one padded"
    return DataLoaders(DataLoader(Blocks(256, 0), bs, shuffle=True), DataLoader(Blocks(50, 1), bs))

def make_model():
    "Embeddings, a causal running mean and a linear head"
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = nn.Embedding(V, 32), nn.Linear(32, V)
        def forward(self, input_ids):
            return self.out(self.emb(input_ids).cumsum(1) / torch.arange(1, input_ids.shape[1] + 1)[:, None])
    return LM()

def lm_loss(logits, labels): return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)

if __name__ == '__main__':
    out = Path(sys.argv[1])
    rank = int(os.environ.get('RANK', '0'))
    set_seed(0)
    trainer = Trainer(data(), lm_loss, torch.optim.AdamW, make_model(),
                      callbacks=[AccelerateCB(), MetricsCB(perplexity=Perplexity(ignore_index=-100), show=False)])
    trainer.fit(2, lr=1e-2)
    torch.save({'state': trainer.model.state_dict(), 'history': trainer.history.state_dict()}, out/f'result_{rank}.pt')
