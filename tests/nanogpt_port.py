"""A port of nanoGPT's recipe, for tests/test_nanogpt.py (and the guide nbs/guides/coming_from_nanogpt.ipynb, which has its own
copy): a small model in nanoGPT's interface (`forward(idx, targets=None) -> (logits, loss)`, `configure_optimizers`,
`get_num_params`, its `config`), written here (nanoGPT's code is not part of aisaac); the loop of nanoGPT's train.py written out
(each stream of batches drawn from a seeded generator of its own); and the same recipe as an aisaac Trainer."""
import math, tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from aisaac.trainer import Trainer
from aisaac.core.callback import Callback
from aisaac.data import DataLoaders
from aisaac.shards import ShardLoader, TokenFile, next_tokens
from aisaac.evals import EvalSetsCB, Eval
from aisaac.callbacks.train import BasicTrainCB, DeviceCB
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.gradients import GradAccumCB, GradClipCB
from aisaac.callbacks.schedule import WarmupCosineSchedulerCB
from aisaac.callbacks.precision import MixedPrecisionCB
from aisaac.text import load_text_corpus

# ---------------------------------------------------------------- a model in nanoGPT's interface
@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 96
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True

class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0., is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))

class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(cfg.n_embd, bias=cfg.bias), SelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias), nn.Dropout(cfg.dropout))
    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

class GPT(nn.Module):
    "nanoGPT's interface: `forward(idx, targets=None) -> (logits, loss)`, `configure_optimizers`, `get_num_params`, `config`"
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(cfg.vocab_size, cfg.n_embd), wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                                              drop=nn.Dropout(cfg.dropout), h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
                                              ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias)))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)): nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None: nn.init.zeros_(m.bias)
        for block in self.transformer.h:
            for p in (block.attn.c_proj.weight, block.mlp[2].weight): nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def get_num_params(self, non_embedding=True):
        return sum(p.numel() for p in self.parameters()) - (self.transformer.wpe.weight.numel() if non_embedding else 0)

    def forward(self, idx, targets=None):
        t = self.transformer
        x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for block in t.h: x = block(x)
        x = t.ln_f(x)
        if targets is None: return self.lm_head(x[:, [-1]]), None
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        ps = [p for p in self.parameters() if p.requires_grad]
        groups = [{'params': [p for p in ps if p.dim() >= 2], 'weight_decay': weight_decay},
                  {'params': [p for p in ps if p.dim() < 2], 'weight_decay': 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({'fused': True} if device_type == 'cuda' else {}))

# ---------------------------------------------------------------- the data: a character-level corpus, as prepare.py makes one
def prepare(dir, n_chars=200_000):
    "Debian's fortunes as nanoGPT's shakespeare_char prepare.py would write them: train.bin and val.bin of uint16 character ids (90/10); the vocabulary size"
    dsd = load_text_corpus()
    text = '\n'.join([*dsd['train']['text'], *dsd['valid']['text']])[:n_chars]
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = int(len(ids) * 0.9)
    ids[:n].tofile(Path(dir)/'train.bin'); ids[n:].tofile(Path(dir)/'val.bin')
    return len(chars)

# ---------------------------------------------------------------- the recipe
@dataclass
class Recipe:
    "nanoGPT's config variables (train_shakespeare_char's, scaled down)"
    batch_size: int = 8
    block_size: int = 32
    gradient_accumulation_steps: int = 2
    learning_rate: float = 1e-3
    max_iters: int = 40
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    warmup_iters: int = 5
    lr_decay_iters: int = 40
    min_lr: float = 1e-4
    eval_interval: int = 10
    eval_iters: int = 3
    dropout: float = 0.1
    seed: int = 1337
    device: str = 'cpu'
    dtype: str = 'float32'  # 'bfloat16': autocast on a GPU (nanoGPT uses none on the CPU)

SEEDS = {'train': 0, 'train_eval': 1, 'val_eval': 2}  # one generator per stream of batches

def model_for(r, vocab_size):
    torch.manual_seed(r.seed)
    return GPT(GPTConfig(block_size=r.block_size, vocab_size=vocab_size, dropout=r.dropout)).to(r.device)

def train_py(r, data_dir, vocab_size):
    "nanoGPT's train.py loop, written out; `get_batch` draws each stream from a generator of its own. Returns each micro-step's loss, each evaluation's batch losses, the weights"
    data = {s: np.memmap(Path(data_dir)/f'{s}.bin', dtype=np.uint16, mode='r') for s in ('train', 'val')}
    gens = {k: torch.Generator().manual_seed(v) for k, v in SEEDS.items()}
    def get_batch(split, stream):
        d = data[split]
        ix = torch.randint(len(d) - r.block_size, (r.batch_size,), generator=gens[stream])
        x = torch.stack([torch.from_numpy(d[i:i + r.block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(d[i + 1:i + 1 + r.block_size].astype(np.int64)) for i in ix])
        return x.to(r.device), y.to(r.device)
    model = model_for(r, vocab_size)
    ctx = torch.autocast('cuda', dtype=torch.bfloat16) if r.dtype == 'bfloat16' and 'cuda' in r.device else nullcontext()
    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split, stream in (('train', 'train_eval'), ('val', 'val_eval')):
            losses = []
            for _ in range(r.eval_iters):
                X, Y = get_batch(split, stream)
                with ctx: _, loss = model(X, Y)
                losses.append(loss.item())
            out[split] = losses
        model.train()
        return out
    def get_lr(it):
        if it < r.warmup_iters: return r.learning_rate * (it + 1) / (r.warmup_iters + 1)
        if it > r.lr_decay_iters: return r.min_lr
        ratio = (it - r.warmup_iters) / (r.lr_decay_iters - r.warmup_iters)
        return r.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (r.learning_rate - r.min_lr)
    optimizer = model.configure_optimizers(r.weight_decay, r.learning_rate, (r.beta1, r.beta2), 'cuda' if 'cuda' in r.device else 'cpu')
    X, Y = get_batch('train', 'train')
    losses, evals, lrs = [], {}, []
    for it in range(r.max_iters + 1):
        lr = get_lr(it)
        for g in optimizer.param_groups: g['lr'] = lr
        lrs.append(lr)
        if it % r.eval_interval == 0: evals[it] = estimate_loss()
        for micro in range(r.gradient_accumulation_steps):
            with ctx:
                logits, loss = model(X, Y)
                losses.append(loss.item())
                loss = loss / r.gradient_accumulation_steps
            X, Y = get_batch('train', 'train')
            loss.backward()
        if r.grad_clip != 0.0: torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses, evals, lrs, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

def aisaac_trainer(r, data_dir, vocab_size, *extra):
    "The same recipe in aisaac: the model, its optimizer, the data, the schedule, accumulation, clipping, precision and evaluation, as callbacks and arguments"
    d = Path(data_dir)
    def loader(split, seed, batches=None):
        return ShardLoader(TokenFile(d/f'{split}.bin', vocab_size=vocab_size), r.block_size, r.batch_size, shuffle=True, seed=seed, batches=batches, tfm=next_tokens)
    dls = DataLoaders(loader('train', SEEDS['train']), loader('val', SEEDS['val_eval'], r.eval_iters))
    model = model_for(r, vocab_size)
    opt_func = lambda params, lr: model.configure_optimizers(r.weight_decay, lr, (r.beta1, r.beta2), 'cuda' if 'cuda' in r.device else 'cpu')
    amp = [MixedPrecisionCB(torch.bfloat16)] if r.dtype == 'bfloat16' and 'cuda' in r.device else []
    return Trainer(dls, None, opt_func, model, callbacks=[
        BasicTrainCB(), DeviceCB(r.device), MetricsCB(show=False), *amp, GradClipCB(r.grad_clip),
        *([GradAccumCB(r.gradient_accumulation_steps)] if r.gradient_accumulation_steps > 1 else []),
        WarmupCosineSchedulerCB(warmup=r.warmup_iters, decay=r.lr_decay_iters, min_lr=r.min_lr, warmup_form='nanogpt'),
        EvalSetsCB(train=Eval(loader('train', SEEDS['train_eval'], r.eval_iters), loss_name='loss', metrics={})), *extra])

def fit(trainer, r, **kw):
    "nanoGPT's iterations 0 to max_iters: an evaluation at iteration 0 and every eval_interval"
    trainer.fit(steps=r.max_iters + 1, valid_every=r.eval_interval, valid_first=True, lr=r.learning_rate, **kw)
    return trainer
