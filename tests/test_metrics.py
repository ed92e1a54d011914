"MetricsCB with torcheval and torchmetrics metrics, on a small classification problem"
from types import SimpleNamespace
import torch
from torch import nn
import torcheval.metrics as tem
import torchmetrics
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB
from aisaac.callbacks.metrics import MetricsCB


def dls(n=300, bs=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g); y = (x[:, 0] + x[:, 1] > 0).long()
    batches = [(x[i:i+bs], y[i:i+bs]) for i in range(0, n, bs)]
    return SimpleNamespace(train=batches, valid=batches)


def accuracy(model, dls):
    with torch.no_grad():
        x = torch.cat([b[0] for b in dls.valid]); y = torch.cat([b[1] for b in dls.valid])
        return (model(x).argmax(1) == y).float().mean().item()


def test_torcheval_and_torchmetrics_agree_with_a_hand_computed_accuracy():
    torch.manual_seed(0)
    d = dls()
    metrics = MetricsCB(te=tem.MulticlassAccuracy(), tm=torchmetrics.Accuracy(task='multiclass', num_classes=2))
    t = Trainer(d, nn.CrossEntropyLoss(), torch.optim.Adam, nn.Linear(4, 2), callbacks=[BasicTrainCB(), metrics])
    t.fit(2, lr=0.05)
    last = metrics.metrics_epoch[-1]
    assert abs(last['te'] - accuracy(t.model, d)) < 1e-6
    assert abs(last['tm'] - last['te']) < 1e-6
    assert last['te'] > 0.9


def test_metrics_are_reset_between_epochs():
    "A model that does not learn (lr=0) gives the same accuracy every epoch: no accumulation across epochs"
    torch.manual_seed(0)
    metrics = MetricsCB(acc=tem.MulticlassAccuracy())
    t = Trainer(dls(), nn.CrossEntropyLoss(), torch.optim.SGD, nn.Linear(4, 2), callbacks=[BasicTrainCB(), metrics])
    t.fit(3, lr=0.)
    accs = [m['acc'] for m in metrics.metrics_epoch]
    assert accs[0] == accs[1] == accs[2]
    assert len({round(l['valid'], 6) for l in metrics.losses_epoch}) == 1


def test_positional_metrics_are_named_by_class():
    assert list(MetricsCB(tem.MulticlassAccuracy(), f1=tem.MulticlassF1Score()).metrics) == ['MulticlassAccuracy', 'f1']
