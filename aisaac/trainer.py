"""aisaac's `Trainer`: the kernel's loop (`aisaac.core.trainer`), with each layer attached at one of its seams."""
__all__ = ['Trainer']
import torch
from .core import trainer as kernel
from .dispatch import CallbackMixin
from .logs import Logging
from .checkpoint import Checkpoints
from .ranks import AgreedRanks
from .steps import StepRuns
from .compat import OtherNames
from .guards import TrainerGuards

class Trainer(TrainerGuards, OtherNames, StepRuns, AgreedRanks, Checkpoints, Logging, CallbackMixin, kernel.Trainer):
    "Train `model` on `dls` with `loss_func` and an optimizer made by `opt_func`; every step is a callback (the kernel's loop, with its layers)"
    own_events = ('predict', 'get_loss', 'backward', 'step', 'zero_grad')  # a subclass's methods of these names are their handlers
    setup_events = ('before_fit',)  # a logger (`must_start`) that fails here stops the fit, whatever its `on_error`
    runtime_attrs = ('model', 'dls', 'loss_func', 'opt_func', 'opt', 'cbs', 'epoch', 'epochs', 'n_epochs', 'lr', 'do_train', 'do_valid', 'dl',
                     'batch', 'batch_num', 'preds', 'loss', 'training', 'outcome', 'exception', 'history', 'clock', 'steps', 'valid_every')
    events = ('before_init', 'after_create', 'after_init', 'cleanup_init', 'before_fit', 'before_train', 'before_epoch', 'before_dataloader',
              'before_data_epoch', 'after_dataloader', 'before_batch', 'before_predict', 'predict', 'after_predict', 'before_loss', 'get_loss',
              'after_loss', 'before_backward', 'backward', 'after_backward', 'before_step', 'step', 'step_skipped', 'after_step',
              'before_zero_grad', 'zero_grad', 'after_zero_grad', 'after_batch', 'cleanup_batch', 'checkpoint', 'after_epoch', 'cleanup_epoch',
              'after_train', 'cleanup_train', 'before_validate', 'after_validate', 'cleanup_validate', 'after_fit', 'cleanup_fit', 'on_exception',
              'before_scheduler_step', 'after_scheduler_step', 'cleanup_scheduler_step', 'log_metrics', 'log', 'log_image', 'log_text',
              'before_save_checkpoint', 'after_save_checkpoint', 'cleanup_save_checkpoint', 'before_load_checkpoint', 'after_load_checkpoint',
              'cleanup_load_checkpoint')  # every event, in the order the loop fires them
    def __init__(self, dls, # an object with `train` and `valid` loaders
                 loss_func, # called as `loss_func(preds, targets)`; `None`: the model computes its own loss
                 opt_func=torch.optim.SGD, # called as `opt_func(params, lr=lr)` at the start of each fit
                 model=None, # the `nn.Module` to train
                 callbacks=None): # callbacks for every fit of this trainer
        super().__init__(dls, loss_func, opt_func, model, callbacks)

    def fit(self, n_epochs:int=3, # number of epochs
            lr:float=1e-3, # learning rate given to `opt_func`
            callbacks=None, # callbacks for this fit only, removed afterwards, also when it raised
            train:bool=True, # run the training pass of each epoch
            valid:bool=True, # run the validation pass of each epoch
            resume_from=None, # a checkpoint file to continue from, written by `save_checkpoint` (`aisaac.checkpoint`)
            steps:int=None, # train for this many optimizer steps, across epochs, instead of `n_epochs` (`aisaac.steps`)
            valid_every=None): # with `steps`: validate every this many steps (`200`, `'200 steps'`) and at the end; default: at the end
        "Fit the model for `n_epochs` (or `steps` optimizer steps), with a new optimizer at `lr`"
        return super().fit(n_epochs, lr, callbacks, train, valid, resume_from=resume_from, steps=steps, valid_every=valid_every)
