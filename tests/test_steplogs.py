"""A run measured in steps (`fit(steps=..., valid_every=...)`) speaks of steps, not epochs: the console's lines, the JSON-lines
and results files' rows, `run_config`, the best step of `SaveBestModelCB` and `EarlyStoppingCB` (older states still load), the
stoppers' messages; and `SampleCB` passes `top_p` and `eos_id` to generation (a Hugging Face model's under its own names)."""
import io, json
from types import SimpleNamespace
import pytest, torch
from torch import nn
import torch.nn.functional as F
from tiny import Script, make_trainer
from aisaac.core.callback import Callback
from aisaac.callbacks.metrics import MetricsCB
from aisaac.callbacks.loggers import ConsoleLogger, JSONLinesLogger, run_config
from aisaac.callbacks.results import ResultsFileCB
from aisaac.callbacks.savers import CheckpointCB, SaveBestModelCB
from aisaac.callbacks.stoppers import EarlyStoppingCB, TerminateOnNaNCB
from aisaac.callbacks.samples import SampleCB, sample_tokens
from aisaac.models import GPT
from aisaac.trainer import Trainer
from aisaac.callbacks.train import BasicTrainCB

def step_run(cbs, steps=8, valid_every=4, **kw):
    "`make_trainer` on 5 batches an epoch, fitted for `steps` steps validated every `valid_every`"
    t = make_trainer(cbs, n_train=(3,) * 5)
    t.fit(steps=steps, valid_every=valid_every, lr=0.01, **kw)
    return t

def jsonl(p): return [json.loads(l) for l in open(p)]

# ------------------------------------------------------------------------------------------------ loggers

def test_the_console_heads_a_step_runs_lines_by_step_and_an_epoch_runs_by_epoch():
    out = io.StringIO()
    step_run([MetricsCB(), ConsoleLogger(file=out)])
    assert [l.split(':')[0] for l in out.getvalue().splitlines()] == ['step 4', 'step 8']  # was 'epoch 4', 'epoch 8'
    out = io.StringIO()
    make_trainer([MetricsCB(), ConsoleLogger(file=out)]).fit(2, lr=0.01)
    assert [l.split(':')[0] for l in out.getvalue().splitlines()] == ['epoch 0', 'epoch 1']

def test_jsonl_rows_of_a_step_run_are_intervals_keyed_by_step(tmp_path):
    class LogBatches(Callback):
        def after_batch(self, t):
            if t.training: t.log({'seen': 1.0}, per='batch')
    t = step_run([MetricsCB(show=False), LogBatches(), JSONLinesLogger(tmp_path/'l.jsonl')])
    lines = jsonl(tmp_path/'l.jsonl')
    assert {l['per'] for l in lines} == {'interval', 'batch'}  # was 'epoch' for the intervals
    rows = [l for l in lines if l['per'] == 'interval']
    assert [l['step'] for l in rows] == [4, 8] and [l['valid_loss'] for l in rows] == t.history.get_metric_values('valid_loss')
    make_trainer([MetricsCB(show=False), JSONLinesLogger(tmp_path/'e.jsonl')]).fit(2, lr=0.01)
    assert [(l['per'], l['step']) for l in jsonl(tmp_path/'e.jsonl')] == [('epoch', 0), ('epoch', 1)]  # an epoch run's as before

def test_the_results_file_of_a_step_run_records_intervals_and_steps(tmp_path):
    t = step_run([MetricsCB(show=False), ResultsFileCB(tmp_path/'r.jsonl')])
    recs = jsonl(tmp_path/'r.jsonl')
    assert [(r['event'], r.get('step'), r.get('epoch')) for r in recs] == [('run_start', None, None), ('interval', 4, None),
                                                                          ('interval', 8, None), ('run_stop', None, None)]
    assert [r['metrics']['valid_loss'] for r in recs[1:3]] == t.history.get_metric_values('valid_loss')
    assert (recs[-1]['intervals'], recs[-1]['steps'], 'epochs' in recs[-1]) == (2, 8, False)
    assert recs[0]['config']['steps'] == 8 and recs[0]['config']['valid_every'] == 4 and 'n_epochs' not in recs[0]['config']

def test_run_config_names_a_step_runs_steps_and_an_epoch_runs_epochs():
    t = step_run([])
    assert (run_config(t)['steps'], run_config(t)['valid_every'], 'n_epochs' in run_config(t)) == (8, 4, False)
    t.fit(2, lr=0.01)
    assert run_config(t)['n_epochs'] == 2 and 'steps' not in run_config(t)

# ------------------------------------------------------------------------------------------------ the best step

def test_save_best_model_knows_the_best_by_its_step_in_a_step_run(tmp_path):
    t = step_run([Script(valid_loss=[0.9, 0.5, 0.3, 0.4]), SaveBestModelCB(tmp_path/'best.pt')], steps=8, valid_every=2)
    cb = t.SaveBestModelCB
    assert (cb.best, cb.best_epoch, cb.best_step) == (0.3, None, 6)  # was best_epoch 2, the interval's number
    assert cb.state_dict() == {'best': 0.3, 'best_epoch': None, 'best_step': 6}
    e = make_trainer([Script(valid_loss=[0.9, 0.5, 0.7]), SaveBestModelCB(tmp_path/'e.pt')])  # 2 batches an epoch
    e.fit(3, lr=0.01)
    assert (e.SaveBestModelCB.best_epoch, e.SaveBestModelCB.best_step) == (1, 4)
    old = SaveBestModelCB(tmp_path/'o.pt'); old.load_state_dict({'best': 0.3, 'best_epoch': 2})  # an older aisaac's state
    assert (old.best, old.best_epoch, old.best_step) == (0.3, 2, None)

def test_the_best_step_goes_through_a_checkpoint_and_a_resume(tmp_path):
    scores = [0.9, 0.3, 0.5, 0.6]
    step_run([Script(valid_loss=scores), SaveBestModelCB(tmp_path/'b.pt'), EarlyStoppingCB(patience=5),
              CheckpointCB(tmp_path/'ckpt', keep_last=None)], steps=6, valid_every=2)
    r = make_trainer([Script(valid_loss=scores), SaveBestModelCB(tmp_path/'b.pt'), EarlyStoppingCB(patience=5)], n_train=(3,) * 5)
    r.fit(steps=8, valid_every=2, lr=0.01, resume_from=tmp_path/'ckpt'/'checkpoint_step_000006.pt')
    assert r.SaveBestModelCB.best_step == r.EarlyStoppingCB.best_step == 4 and r.EarlyStoppingCB.wait == 2

def test_early_stopping_in_a_step_run_names_the_steps():
    stopper = EarlyStoppingCB()
    t = step_run([stopper, Script(valid_loss=[1.0, 0.9, 0.895, 0.5])], steps=16, valid_every=2)
    assert (t.clock.step, stopper.best, stopper.best_epoch, stopper.best_step) == (6, 0.9, None, 4)
    assert stopper.reason == ("EarlyStoppingCB: valid_loss has not improved by more than 0.01 for 1 interval (best 0.9 at step 4, now 0.895); "
                              "the fit stops after step 6")  # was "for 1 epoch (best 0.9 at epoch 1, ...) ... after epoch 2"
    assert stopper.state_dict() == {'best': 0.9, 'best_epoch': None, 'best_step': 4, 'wait': 1, 'stop': stopper.reason}  # (the stop it asked for: a checkpoint written then resumes to it)
    old = EarlyStoppingCB(); old.load_state_dict({'best': 0.9, 'best_epoch': 1, 'wait': 0})
    assert (old.best, old.best_epoch, old.best_step, old.wait) == (0.9, 1, None, 0)

def test_a_nan_loss_in_a_step_run_is_named_by_its_step():
    class NaNAt(Callback):
        order = -1
        def after_loss(self, t):
            if t.clock.step == 5 and t.model.training: t.loss = t.loss * float('nan')
    stop = TerminateOnNaNCB()
    t = step_run([stop, NaNAt()], steps=12, valid_every=3)
    assert t.clock.step == 5
    assert stop.reason == 'TerminateOnNaNCB: the training loss is nan at step 6; the fit stops before the weights are updated with it'

# ------------------------------------------------------------------------------------------------ SampleCB: top_p, eos_id

class Chars:
    "Letters a..z as tokens 0..25"
    def encode(self, text): return [ord(c) - 97 for c in text]
    def decode(self, ids): return ''.join(chr(97 + i) for i in ids)

def lm_trainer(model):
    torch.manual_seed(0)
    ids = torch.randint(0, 26, (8, 9))
    lm_loss = lambda logits, labels: F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    return Trainer(SimpleNamespace(train=[(ids[:, :-1], ids[:, 1:])], valid=[]), lm_loss, torch.optim.Adam, model, callbacks=[BasicTrainCB()])

def tiny_gpt():
    torch.manual_seed(0)
    return GPT(26, n_layer=1, n_head=1, d_model=8, block_size=16)

def test_samplecb_passes_top_p_to_the_gpt_and_stops_at_eos_id():
    t = lm_trainer(tiny_gpt())
    greedy = SampleCB('abc', Chars(), max_new_tokens=8, temperature=0).sample(t)
    assert len(greedy) == 8
    assert SampleCB('abc', Chars(), max_new_tokens=8, temperature=1.0, top_k=None, top_p=1e-6).sample(t) == greedy  # the nucleus: the likeliest only
    eos = Chars().encode(greedy[3])[0]
    ended = SampleCB('abc', Chars(), max_new_tokens=8, temperature=0, eos_id=eos)
    assert ended.sample(t) == greedy[:greedy.index(greedy[3])] and ended.samples[-1][1] == greedy[:greedy.index(greedy[3])]
    with pytest.raises(ValueError, match='top_p'): SampleCB('abc', Chars(), top_p=0)

def test_sample_tokens_takes_top_p_and_ends_rows_at_eos_id():
    class Bigram(nn.Module):
        def __init__(self): super().__init__(); self.table = nn.Embedding(26, 26)
        def forward(self, ids): return self.table(ids)
    torch.manual_seed(0)
    m = Bigram()
    idx = torch.tensor([[0], [1]])
    greedy = sample_tokens(m, idx, 6, temperature=0)
    assert torch.equal(sample_tokens(m, idx, 6, top_p=1e-6), greedy)
    eos = int(greedy[0, 2])
    out = sample_tokens(m, idx, 6, temperature=0, eos_id=eos)
    assert out.shape[1] <= greedy.shape[1] and (out[0, 2:] == eos).all()
    assert SampleCB('a', Chars(), max_new_tokens=6, temperature=0, eos_id=eos).sample(lm_trainer(m)) == Chars().decode(greedy[0, 1:2].tolist())

def test_samplecb_gives_a_hugging_face_model_top_p_and_eos_token_id_and_cuts_its_text_there():
    class FakeHF(nn.Module):
        "A transformers-like model: `generation_config` and a `generate` that records its arguments"
        def __init__(self, eos=None):
            super().__init__(); self.w = nn.Parameter(torch.zeros(1)); self.generation_config = SimpleNamespace(eos_token_id=eos)
        def generate(self, idx, **kw): self.kw = kw; return torch.cat([idx, torch.tensor([[3, 4, 25, 25]])], 1)
    m = FakeHF()
    assert SampleCB('abc', Chars(), max_new_tokens=4, top_p=0.9, eos_id=25).sample(lm_trainer(m)) == 'de'
    assert (m.kw['top_p'], m.kw['eos_token_id'], m.kw['pad_token_id']) == (0.9, 25, 25)
    m = FakeHF(eos=[4, 7])  # its own end-of-text tokens, when none is given
    assert SampleCB('abc', Chars(), max_new_tokens=4).sample(lm_trainer(m)) == 'd'
    assert 'top_p' not in m.kw and 'eos_token_id' not in m.kw and m.kw['pad_token_id'] == 4
