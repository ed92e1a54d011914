"MoveModulesToDeviceCB: which attributes move, where to, and when."
import torch
from torch import nn

from aisaac.core.callback import Callback, CancelFitException
from aisaac.callbacks.train import DeviceCB
from aisaac.callbacks.devices import MoveModulesToDeviceCB
from tiny import make_trainer

class Recorder(nn.Module):
    "A module that records where it is sent"
    def __init__(self): super().__init__(); self.calls = []
    def to(self, *args, **kwargs):
        self.calls.append(torch.device(args[0]))
        return self

class ModuleCallback(nn.Module, Callback):
    "A callback that is also a module: not the mover's business"
    def __init__(self): nn.Module.__init__(self); self.calls = []
    def to(self, *args, **kwargs): self.calls.append(args); return self
    def before_fit(self, t): pass

class StopAtStart(Callback):
    "Ends the fit once every `before_fit` up to order 2 has run: the mover's work is done"
    order = 2
    def before_fit(self, t): raise CancelFitException()

def test_moves_every_module_attribute_but_the_model_callbacks_and_private_ones():
    t = make_trainer([])
    t.loss_func, t.teacher, t._private, t.number = Recorder(), Recorder(), Recorder(), 3
    cb, mover = ModuleCallback(), MoveModulesToDeviceCB('meta')
    t.fit(1, callbacks=[cb, mover, StopAtStart()])
    assert mover.moved == ['loss_func', 'teacher']
    assert t.loss_func.calls == t.teacher.calls == [torch.device('meta')]
    assert t._private.calls == [] and cb.calls == [] and t.model.weight.device.type == 'cpu'

def test_follows_the_model_after_device_cb_each_fit():
    t = make_trainer([MoveModulesToDeviceCB()])
    t.teacher = Recorder()
    t.fit(1, callbacks=[DeviceCB('meta'), StopAtStart()])
    t.fit(1, callbacks=[StopAtStart()])
    assert t.teacher.calls == [torch.device('meta')] * 2

def test_a_model_without_parameters_means_the_cpu():
    t = make_trainer([], model=nn.ReLU(), opt_func=lambda params, lr: None)  # no parameters, no optimizer
    t.teacher = Recorder()
    t.fit(1, callbacks=[MoveModulesToDeviceCB(), StopAtStart()])
    assert t.teacher.calls == [torch.device('cpu')]
