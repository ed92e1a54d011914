"""Resume x the records of callbacks that keep them: a resumed fit's records (and kept gradients) equal the uninterrupted fit's.
`LRMonitorCB`, miniai's `RecorderCB` and `SampleCB` kept their records out of checkpoints; `MomentumTrainCB` the gradients it keeps
between steps (issue 51, the resume invariant)."""
import pytest, torch
from torch import nn
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB, MomentumTrainCB
from aisaac.callbacks.monitors import LRMonitorCB
from aisaac.callbacks.samples import SampleCB
from aisaac.learner import RecorderCB
from aisaac.models import GPT
from checkpoint_run import make_trainer, StopAt

def _stop_and_resume(tmp_path, make, n_epochs=3, epoch=1, batch=4):
    "The uninterrupted fit, and the fit stopped after training batch `batch` of epoch `epoch`, resumed by a new trainer"
    straight = make(); straight.fit(n_epochs)
    stopped = make(); stopped.add_callbacks([StopAt(tmp_path/'c.pt', epoch, batch)]); stopped.fit(n_epochs)
    resumed = make(); resumed.fit(n_epochs, resume_from=tmp_path/'c.pt')
    return straight, resumed

def _recs(cb):
    return {k: [float(x) for x in v] for k, v in cb.recs.items()}

def test_lrmonitorcb_resumes_its_rates(tmp_path):
    "Before: the resumed fit's `LRMonitorCB.recs['lr']` held only the 21 rates after the resume, the uninterrupted fit's 39"
    straight, resumed = _stop_and_resume(tmp_path, lambda: make_trainer(callbacks=[LRMonitorCB()]))
    assert len(straight.LRMonitorCB.recs['lr']) == 39
    assert resumed.LRMonitorCB.recs == straight.LRMonitorCB.recs and resumed.LRMonitorCB._steps == straight.LRMonitorCB._steps

def test_miniais_recordercb_resumes_its_records(tmp_path):
    "Before: the resumed fit's `RecorderCB.recs['lr']` held only the 21 values after the resume, and all one rate (0.000834: its `pg` was the group the resumed optimizer replaced), the uninterrupted fit's 39"
    make = lambda: make_trainer(callbacks=[RecorderCB(lr=lambda cb: cb.pg['lr'], mom=lambda cb: cb.pg['betas'][0])])
    straight, resumed = _stop_and_resume(tmp_path, make)
    assert len(straight.RecorderCB.recs['lr']) == 39
    assert _recs(resumed.RecorderCB) == _recs(straight.RecorderCB)

class Chars:
    "A character tokenizer"
    def encode(self, text): return [ord(c) % 64 for c in text]
    def decode(self, ids): return ''.join(chr(65 + i % 26) for i in ids)

def test_samplecb_resumes_its_samples(tmp_path):
    "Before: the resumed fit's `SampleCB.samples` had the steps [15, 18, 21, 24] (those after the resume), the uninterrupted fit's [3, 6, ..., 24]"
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (64, 9))
    dls = type('D', (), {'train': [(ids[i:i+8, :-1], ids[i:i+8, 1:]) for i in range(0, 64, 8)], 'valid': [(ids[:8, :-1], ids[:8, 1:])]})()
    def make():
        torch.manual_seed(0)
        return Trainer(dls, lambda out, y: nn.functional.cross_entropy(out.flatten(0, 1), y.flatten()), torch.optim.AdamW,
                       GPT(64, n_layer=1, n_head=2, d_model=16, block_size=16),
                       callbacks=[BasicTrainCB(), SampleCB('abc', Chars(), every='3 steps', max_new_tokens=4)])
    straight, resumed = _stop_and_resume(tmp_path, make, batch=4)
    assert [s for s, _ in straight.SampleCB.samples] == [3, 6, 9, 12, 15, 18, 21, 24]
    assert resumed.SampleCB.samples == straight.SampleCB.samples

def test_momentumtraincb_resumes_the_gradients_it_keeps(tmp_path):
    "The gradients MomentumTrainCB keeps between steps (0.85 of the last) are in the checkpoint. Before: the resumed weights differed from the uninterrupted fit's by up to 0.0041 (the first step after the resume started from no gradient)"
    def make():
        t = make_trainer()
        t.remove_callbacks([t.BasicTrainCB]); t.add_callbacks([MomentumTrainCB(0.85)])
        return t
    straight, resumed = _stop_and_resume(tmp_path, make)
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff == 0, diff
    for p, q in zip(straight.model.parameters(), resumed.model.parameters()): assert torch.equal(p.grad, q.grad)
