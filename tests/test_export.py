"ExportCB and export_model: every format read back gives the model's outputs; the best weights are the ones exported; errors name the fix."
import importlib.util
import pytest
import torch
from torch import nn
from aisaac.core.callback import Callback
from aisaac.callbacks.export import ExportCB, export_model, load_exported
from aisaac.callbacks.savers import SaveBestModelCB
import aisaac.callbacks.export as export_module
from checkpoint_run import make_trainer

HOWS = ['export', 'torchscript'] + (['onnx'] if all(importlib.util.find_spec(m) for m in ('onnx', 'onnxscript')) else [])

@pytest.mark.filterwarnings('ignore:`torch.jit')
@pytest.mark.parametrize('how', HOWS)
def test_an_export_read_back_gives_the_model_outputs_on_any_batch_size(tmp_path, how):
    t = make_trainer(callbacks=[ExportCB(tmp_path/'model', how=how)])
    t.fit(1)
    f = load_exported(t.ExportCB.exported)
    assert t.ExportCB.exported.suffix == {'export': '.pt2', 'torchscript': '.pt', 'onnx': '.onnx'}[how]
    t.model.eval()
    for xb in (t.dls.valid.dataset.tensors[0][:16], t.dls.valid.dataset.tensors[0][:3]):
        with torch.no_grad(): got, expected = f(xb), t.model(xb)
        if how == 'onnx': torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        else: assert torch.equal(got, expected)

def test_the_best_weights_are_the_ones_exported(tmp_path):
    class Scores(Callback):
        order = -1
        def __init__(self): self.values, self.states = [0.5, 0.1, 0.4], []
        def after_validate(self, trainer):
            self.states.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
            trainer.history.update_metric('valid_loss', self.values[trainer.epoch], step=trainer.epoch)
    t = make_trainer(callbacks=[ExportCB(tmp_path/'model.pt2'), SaveBestModelCB(tmp_path/'best.pt'), Scores()])
    t.remove_callbacks(t.MetricsCB)
    t.fit(3)
    best = make_trainer().model.eval()
    best.load_state_dict(t.Scores.states[1])
    xb = t.dls.valid.dataset.tensors[0][:8]
    with torch.no_grad(): assert torch.equal(load_exported(tmp_path/'model.pt2')(xb), best(xb))

def test_nothing_is_exported_after_an_error(tmp_path):
    class Boom(Callback):
        def after_epoch(self, trainer): raise RuntimeError('boom')
    with pytest.raises(RuntimeError, match='boom'): make_trainer(callbacks=[ExportCB(tmp_path/'model'), Boom()]).fit(1)
    assert not list(tmp_path.iterdir())

def test_onnx_without_the_extra_names_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(export_module.importlib.util, 'find_spec', lambda name, *a: None if name == 'onnxscript' else real(name, *a))
    with pytest.raises(ImportError, match=r'needs onnxscript: `pip install "aisaac\[onnx\]"`'): ExportCB('m', how='onnx')
    with pytest.raises(ImportError, match=r'aisaac\[onnx\]'): export_model(nn.Linear(2, 1), torch.randn(2, 2), 'm.onnx', how='onnx')

def test_load_exported_names_the_formats():
    with pytest.raises(ValueError, match=r'ends in .pt2 \(torch.export\), .pt \(TorchScript\) or .onnx'): load_exported('model.bin')

@pytest.mark.filterwarnings('ignore:`torch.jit')
@pytest.mark.parametrize('how', HOWS)
def test_a_model_traced_on_one_row_takes_any_batch_size(tmp_path, how):
    "`export_model(model, x[:1], ...)` (or `ExportCB` on a fit whose last batch has one item): the batch dimension stays free (before, with torch.export: 'Guard failed: input.size()[0] == 1' on a batch of 7)"
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), torch.randn(7, 4)
    f = load_exported(export_model(model, x[:1], tmp_path/f'one.{ {"export": "pt2", "torchscript": "pt", "onnx": "onnx"}[how] }', how=how))
    with torch.no_grad(): torch.testing.assert_close(f(x), model(x), rtol=1e-5, atol=1e-6)
