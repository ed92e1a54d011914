"Initialisation: Kaiming scales, LSUV reaching its targets on every layer, touching nothing else, and LSUVInitCB running once."
import copy, math, warnings
from functools import partial
import pytest, torch
from torch import nn

from aisaac.models import get_model_conv, get_model_resnet, act_gr, GeneralRelu
from aisaac.core.callback import Callback
from aisaac.callbacks.init import init_weights, lsuv_init, LSUVInitCB
from aisaac.callbacks.train import BasicTrainCB, OneBatchCB
from aisaac.trainer import Trainer
from tiny import make_dls

def batch(n=64, seed=0): return torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))

def outputs(model, modules, xb):
    "(mean, std) of each of `modules`' outputs on `xb`"
    res = {}
    hooks = [m.register_forward_hook(lambda m, i, o: res.__setitem__(m, (o.mean().item(), o.std().item()))) for m in modules]
    with torch.no_grad(): model(xb)
    for h in hooks: h.remove()
    return [res[m] for m in modules]

@pytest.mark.parametrize('leaky', [0., 0.1, 0.3])
def test_init_weights_kaiming_scale(leaky):
    torch.manual_seed(0)
    m = nn.Conv2d(64, 128, 3)
    lin = nn.Linear(10, 10); before = lin.weight.clone()
    init_weights(m, leaky); init_weights(lin, leaky)
    assert math.isclose(m.weight.std().item(), math.sqrt(2 / ((1 + leaky**2) * 64 * 9)), rel_tol=0.02)
    assert torch.equal(lin.weight, before)  # only convolutions, as in miniai

@pytest.mark.parametrize('norm', [None, nn.BatchNorm2d])
def test_lsuv_every_conv_reaches_mean_0_std_1(norm):
    torch.manual_seed(0)
    model, xb = get_model_conv(act_gr, norm=norm), batch()
    for m in model.modules(): lsuv_init(model, m, xb, targ_mean=0)  # AIsaac's way: every module, those without weights skipped
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    for conv, (mean, std) in zip(convs, outputs(model, convs, xb)):
        assert abs(std - 1) < 1e-3
        if conv.bias is not None: assert abs(mean) < 1e-3

def test_lsuv_defaults_are_aisaacs_in_its_call_and_miniais_in_its_own():
    "AIsaac's `lsuv_init(model, module, xb)` aims at mean 0.5 (its `targ_mean` default); miniai's `(model, m, m_in, xb)` at 0"
    torch.manual_seed(0)
    model, xb = get_model_conv(act_gr), batch()
    twin = copy.deepcopy(model)
    for m in model.modules(): lsuv_init(model, m, xb)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    for mean, std in outputs(model, convs, xb): assert abs(mean - 0.5) < 1e-3 and abs(std - 1) < 1e-3
    for layer in twin[:4]: lsuv_init(twin, layer[1], layer[0], xb)
    for mean, std in outputs(twin, [l[1] for l in twin[:4]], xb): assert abs(mean) < 1e-3 and abs(std - 1) < 1e-3
    assert LSUVInitCB().kwargs['targ_mean'] == 0 and LSUVInitCB(targ_mean=0.5).kwargs['targ_mean'] == 0.5

def test_lsuv_one_pass_when_measured_at_the_layer():
    "Measured at the layer, one rescaling reaches the targets: the second pass only confirms"
    torch.manual_seed(0)
    model, xb = nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 5)), torch.randn(128, 20) * 3 + 1
    mean, std = lsuv_init(model, model[0], xb, max_loops=1, targ_mean=0.5, target_std=2.)
    assert abs(mean - 0.5) < 1e-4 and abs(std - 2.) < 1e-4

def test_lsuv_after_an_activation():
    torch.manual_seed(0)
    model, xb = get_model_conv(act_gr), batch()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        for layer in model[:4]: lsuv_init(model, layer[0], xb, measurement_module=layer[1], targ_mean=0)
    for mean, std in outputs(model, [l[1] for l in model[:4]], xb): assert abs(mean) < 1e-3 and abs(std - 1) < 1e-3

def test_lsuv_miniai_argument_order():
    "miniai's `lsuv_init(model, m, m_in, xb)`: measured module first, then the one to change, then the batch"
    torch.manual_seed(0)
    model, xb = get_model_conv(act_gr), batch()
    twin = copy.deepcopy(model)
    for layer, other in zip(model[:4], twin[:4]):
        ours = lsuv_init(model, layer[0], xb, measurement_module=layer[1], targ_mean=0)
        assert lsuv_init(twin, other[1], other[0], xb) == ours
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))

def test_lsuv_changes_only_the_layer():
    torch.manual_seed(0)
    model, xb = get_model_resnet(act_gr, nfs=(4, 8, 8, 8, 8, 8)), batch(32)
    target = model[2].convs[0][0]
    before = copy.deepcopy(model.state_dict())
    lsuv_init(model, target, xb)
    after = model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed == ['2.convs.0.0.weight']  # no bias (a batchnorm follows); running stats and counters put back

def test_lsuv_runs_in_float32_under_autocast():
    torch.manual_seed(0)
    model, xb = get_model_conv(), batch()
    with torch.autocast('cpu', dtype=torch.bfloat16): mean, std = lsuv_init(model, model[1][0], xb, targ_mean=0)
    (m, s), = outputs(model, [model[1][0]], xb)
    assert abs(m) < 1e-3 and abs(s - 1) < 1e-3 and (mean, std) == pytest.approx((m, s), abs=1e-6)

def test_lsuv_warns_when_it_cannot_get_there():
    model, xb = get_model_conv(), batch()
    with pytest.warns(UserWarning, match=r"after 3 passes the output of `0.1` \(after `0.0`\) .* A ReLU's output cannot have mean 0"):
        lsuv_init(model, model[0][0], xb, measurement_module=model[0][1], targ_mean=0, max_loops=3)

def test_lsuv_errors_and_skips():
    model, xb = get_model_conv(), batch()
    assert lsuv_init(model, model[0], xb) is None  # a container has no weight: skipped
    assert lsuv_init(model, model[0][1], xb) is None  # nor has an activation
    with pytest.raises(ValueError, match='did not run in `model'): lsuv_init(model, nn.Conv2d(1, 8, 3), xb)
    with pytest.raises(ValueError, match='std nan on this batch'): lsuv_init(model, model[0][0], xb[:1] * float('nan'))
    with pytest.raises(TypeError, match='`module` must be a layer of the model'): lsuv_init(model, '0.0', xb)

def test_lsuv_cb_no_layers_is_an_error():
    t = Trainer(conv_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, nn.Sequential(nn.Flatten(), nn.Linear(784, 10)),
                callbacks=[BasicTrainCB(), LSUVInitCB(modules=lambda m: [])])
    with pytest.raises(ValueError, match='found no layer to initialise'): t.fit(1)

class Snapshot(Callback):
    "Keeps the model's state and the LSUV-ed outputs right after `LSUVInitCB`, before the first forward pass"
    order = 1
    def __init__(self): self.states = []
    def before_predict(self, t):
        if t.training: self.states.append(copy.deepcopy(t.model.state_dict())); self.xb = t.batch[0]

def conv_dls(n=3, bs=16):
    g = torch.Generator().manual_seed(0)
    b = [(torch.randn(bs, 1, 28, 28, generator=g), torch.randint(0, 10, (bs,), generator=g)) for _ in range(n)]
    return type('DLs', (), {'train': b, 'valid': b[:1]})()

def test_lsuv_cb_first_training_batch_only_once():
    torch.manual_seed(0)
    model = get_model_conv(norm=nn.BatchNorm2d)
    initial = copy.deepcopy(model.state_dict())
    cb, snap = LSUVInitCB(), Snapshot()
    t = Trainer(conv_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[BasicTrainCB(), cb, snap])
    t.fit(1, lr=0.)  # lr 0: only LSUV changes the weights (the forward passes still update the running statistics)
    at_first = snap.states[0]
    convs = [k for k in initial if k.endswith('0.weight') or k == '4.0.bias']
    assert all(not torch.equal(initial[k], at_first[k]) for k in convs)
    assert all(torch.equal(initial[k], at_first[k]) for k in initial if k not in convs)  # batchnorms and their running stats untouched
    assert len(cb.stats) == 5 and all(abs(s - 1) < 1e-3 for _, s in cb.stats.values())
    assert cb.done and cb.state_dict() == {'done': True, 'stats': {k: list(v) for k, v in cb.stats.items()}}  # the report goes into checkpoints too
    t.fit(1, lr=0.)
    assert torch.equal(snap.states[3]['0.0.weight'], at_first['0.0.weight'])  # no second initialisation
    cb2 = LSUVInitCB(); cb2.load_state_dict({'done': True})
    t.fit(1, lr=0., callbacks=cb2)
    assert cb2.stats == {}

def test_lsuv_cb_initialises_again_when_its_work_was_undone():
    "Weights put back as they were before the initialisation (an LR-finder sweep does that) mean: initialise again"
    torch.manual_seed(0)
    model = get_model_conv()
    cb, snap = LSUVInitCB(), Snapshot()
    t = Trainer(conv_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[BasicTrainCB(), cb, snap])
    initial = copy.deepcopy(model.state_dict())
    t.fit(1, lr=0.1)
    model.load_state_dict(initial)  # undo everything
    t.fit(1, lr=0.1)
    assert torch.equal(snap.states[3]['0.0.weight'], snap.states[0]['0.0.weight'])  # the same initialisation, again
    t.fit(1, lr=0.1)  # trained weights: no third initialisation
    assert not torch.equal(snap.states[6]['0.0.weight'], snap.states[0]['0.0.weight'])

def test_lsuv_cb_with_lr_find():
    from aisaac.callbacks.lr_finder import LRFinderCB  # the LR finder (issue 11, part A)
    torch.manual_seed(0)
    cb, snap = LSUVInitCB(), Snapshot()
    t = Trainer(conv_dls(n=6), nn.CrossEntropyLoss(), torch.optim.SGD, get_model_conv(), callbacks=[BasicTrainCB(), cb, snap])
    before = copy.deepcopy(t.model.state_dict())
    t.lr_find(plot=False, max_epochs=1)
    assert not cb.done and all(torch.equal(v, t.model.state_dict()[k]) for k, v in before.items())  # the sweep ran it; its transaction undid it all
    n = len(snap.states)
    t.fit(1, lr=0.)
    convs = [m for m in t.model.modules() if isinstance(m, nn.Conv2d)]
    for mean, std in outputs(t.model, convs, t.dls.train[0][0]): assert abs(std - 1) < 1e-3  # initialised on the real fit's first batch
    assert not torch.equal(snap.states[n]['0.0.weight'], before['0.0.weight'])

def test_lsuv_cb_never_on_validation():
    cb = LSUVInitCB()
    t = Trainer(conv_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, get_model_conv(), callbacks=[BasicTrainCB(), cb])
    t.fit(1, train=False)
    assert not cb.done and cb.stats == {}

def test_lsuv_cb_chosen_modules():
    model = get_model_conv(act_gr)
    pairs = LSUVInitCB(modules=lambda m: [(l[0], l[1]) for l in m[:4]])
    t = Trainer(conv_dls(), nn.CrossEntropyLoss(), torch.optim.SGD, model, callbacks=[BasicTrainCB(), pairs, OneBatchCB()])
    snap = Snapshot()
    t.fit(1, lr=0., callbacks=snap)
    assert list(pairs.stats) == ['0.0', '1.0', '2.0', '3.0']
    for mean, std in outputs(model, [l[1] for l in model[:4]], snap.xb): assert abs(mean) < 1e-3 and abs(std - 1) < 1e-3
    only = LSUVInitCB(modules=[model[4][0]])
    t.fit(1, lr=0., callbacks=[only, snap])
    assert list(only.stats) == ['4.0']

def test_lsuv_cb_on_a_linear_model():
    torch.manual_seed(0)
    t = Trainer(make_dls(n_train=(32,)), nn.MSELoss(), torch.optim.SGD, nn.Linear(2, 1), callbacks=[BasicTrainCB(), LSUVInitCB()])
    t.fit(1, lr=0.)
    xb = t.dls.train[0][0]
    out = t.model(xb)
    assert abs(out.mean().item()) < 1e-3 and abs(out.std().item() - 1) < 1e-3

def test_a_resumed_fit_keeps_the_initialisations_report():
    """Found by the invariance harness (issue 51: LSUVInitCB under `resume`): `stats`, each layer's (mean, std) after the initialisation, was in
    no checkpoint, so after a resume it was empty ({'0': ..., '3': ...} straight, {} resumed) while `done` said the initialisation had run"""
    from aisaac.coverage import check
    assert check(['LSUVInitCB'], 'resume') == []
