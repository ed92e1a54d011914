"The tiny preference and distillation runs that tests/test_preference.py and tests/test_distill.py make on one process and tests/posttrain_run.py on two."
import types
import torch
from aisaac.data import DataLoaders, TensorLoader
from aisaac.pairs import PairBatch, pad_pairs, pack_pairs
from aisaac.models import GPT
from aisaac.trainer import Trainer
from aisaac.callbacks.gradients import GradAccumCB
from posttrain_run import Record, tiny_gpt, weights

V, PAD = 50, 0

def synthetic_pairs(n, seed=0):
    "`n` tokenized pairs (as `tokenize_pairs` gives them) of random ids: prompts of 3-6 tokens, replies of 2-7, the last token of each reply an end token (1)"
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi, (), generator=g))
    out = []
    for _ in range(n):
        ex = {'prompt': torch.randint(2, V, (r(3, 7),), generator=g).tolist()}
        for k in ('chosen', 'rejected'):
            ex[k] = torch.randint(2, V, (r(1, 7),), generator=g).tolist() + [1]
            ex[f'{k}_labels'] = list(ex[k])
        out.append(ex)
    return out

def pair_loaders(pairs, bs, pack=False, length=17, shuffle=False):
    "DataLoaders of `pairs` as `pairs_dataloaders` makes them (aisaac's shifted labels), in order unless `shuffle`"
    rows = pack_pairs(pairs, length, PAD) if pack else pad_pairs(pairs, PAD, length)
    dl = TensorLoader(*rows, bs=bs, shuffle=shuffle, seed=0, tfm=PairBatch())
    dls = DataLoaders(dl, TensorLoader(*rows, bs=bs, tfm=PairBatch()))
    dls.hf_labels = False
    return dls

def fit_pairs_run(model, dls, cbs, n_accum=1, lr=0.5, opt=torch.optim.SGD, n_epochs=1):
    "A fit of one epoch (SGD): the recorder of its losses and gradient norms, and the trainer"
    rec = Record()
    t = Trainer(dls, None, opt, model, callbacks=[*cbs, GradAccumCB(n_accum), rec])
    t.fit(n_epochs, lr=lr, valid=False)
    return rec, t

def run(case, rank):
    "Rank `rank`'s part of a 2-process case"
    from torch import nn
    if case == 'dpo':
        from aisaac.callbacks.preference import PreferenceCB
        pairs = synthetic_pairs(16)
        mine = [p for i, p in enumerate(pairs) if (i // 2) % 2 == rank]  # each batch of 4 pairs: 2 on each process
        model = nn.parallel.DistributedDataParallel(tiny_gpt())
        rec, _ = fit_pairs_run(model, pair_loaders(mine, 2), [PreferenceCB(reference=tiny_gpt(), chunk=8)])
        return {'losses': rec.losses, 'norms': rec.norms, 'weights': weights(model.module)}
    if case == 'distill':
        model = nn.parallel.DistributedDataParallel(tiny_gpt())
        rec = distill_fit(model, distill_batches()[2 * rank:2 * rank + 2], [], 2)
        return {'losses': rec.losses, 'norms': rec.norms, 'weights': weights(model.module)}
    raise ValueError(case)

def distill_batches(n=4, bs=2, T=12, seed=2):
    "`n` batches of shifted SFT-like labels (the first 3 + i masked), as dicts"
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, V, (bs, T + 1), generator=g)
        labels = ids[:, 1:].clone(); labels[:, :3 + i] = -100
        out.append({'input_ids': ids[:, :-1], 'labels': labels})
    return out

def distill_fit(model, batches, cbs, n_accum, teacher_seed=7):
    "One step per `n_accum` batches, SGD, distilled from a tiny GPT of seed `teacher_seed` (JSD, temperature 2, alpha 0.7)"
    from aisaac.data import DataLoaders
    from aisaac.models import lm_loss
    from aisaac.callbacks.distill import DistillCB
    rec = Record()
    t = Trainer(DataLoaders(batches, batches[:1]), lm_loss, torch.optim.SGD, model,
                callbacks=[DistillCB(tiny_gpt(teacher_seed), 'jsd', beta=0.3, temperature=2., alpha=0.7, chunk=8), *cbs, GradAccumCB(n_accum), rec])
    t.fit(1, lr=0.5, valid=False)
    return rec
