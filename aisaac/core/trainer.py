"""The `Trainer`: the loop, from `fit` to one batch, whose every step is a callback."""
__all__ = ['Trainer']
import itertools
import torch
from .callback import (event, CancelFitException, CancelEpochException, CancelBatchException, CancelBackwardException,
                       CancelStepException)
from .dispatch import CallbackMixin, with_cbs

_predict = ('before_predict', 'predict', 'after_predict', 'before_loss', 'get_loss', 'after_loss')
_backward, _step = ('before_backward', 'backward', 'after_backward'), ('before_step', 'step')
_after_step = ('after_step', 'before_zero_grad', 'zero_grad', 'after_zero_grad')

class Trainer(CallbackMixin):
    "Train `model` on `dls` with `loss_func` and an optimizer made by `opt_func`: every step of a batch is a callback"
    events = event.names
    def __init__(self, dls, # an object with `train` and `valid` loaders
                 loss_func, # called as `loss_func(preds, targets)` by the callback that computes the loss
                 opt_func=torch.optim.SGD, # called as `opt_func(params, lr=lr)` at the start of each fit
                 model=None, # the `nn.Module` to train
                 callbacks=None): # callbacks for every fit of this trainer
        self.dls, self.loss_func, self.opt_func, self.model = dls, loss_func, opt_func, model
        self.opt, self.batch, self.epoch, self.batch_num, self.first_batch, self.stop_reason = None, None, 0, 0, 0, None
        self.add_callbacks(callbacks)
        self.run_callbacks('after_create')

    @property
    def training(self): "Whether the model is in training mode"; return self.model.training

    def fit(self, n_epochs:int=3, # number of epochs
            lr:float=1e-3, # learning rate given to `opt_func`
            callbacks=None, # callbacks for this fit only, removed afterwards (also when it failed)
            train:bool=True, # run the training pass of each epoch
            valid:bool=True, # run the validation pass of each epoch
            **options): # what the layers take: `steps=`, `valid_every=`, `resume_from=`
        "Fit the model for `n_epochs`, with a new optimizer at `lr`"
        self.check_fit(n_epochs, lr, train, valid, **options)
        self.fit_callbacks = self.add_callbacks(callbacks)
        try:
            self.start_fit(n_epochs, lr, train, valid, **options)
            self._fit(train, valid)
        except CancelFitException: pass  # raised in `cleanup_fit`: the fit is over anyway
        except (Exception, KeyboardInterrupt) as e:
            self.exception = err = self.fit_error(e)
            self.run_callbacks('on_exception', exception=err)
            if err is e: raise
            raise err from e
        finally: self.end_fit()

    def check_fit(self, n_epochs, lr, train, valid, **options):
        "Refuse a fit that cannot work, before anything changes: options no layer took (layers check their arguments first)"
        if options: raise TypeError(f"fit() got {', '.join(map(repr, options))}, which no layer of this {type(self).__name__} takes")

    def start_fit(self, n_epochs, lr, train, valid, **options):
        "Set a fit up, its callbacks added: its epochs, learning rate and a new optimizer (layers add callbacks and state)"
        self.n_epochs, self.epochs, self.lr, self.do_train, self.do_valid = n_epochs, range(n_epochs), lr, train, valid
        self.opt, self.stop_reason = self.opt_func(self.model.parameters(), lr=lr), None
        self.model.zero_grad(set_to_none=True)  # no gradients left by a fit that stopped between backward and step

    def fit_error(self, e:BaseException): return e  # the error a failed fit raises for `e` (layers name a better one)

    def end_fit(self):
        "After a fit, however it ended: remove its callbacks and switch every callback on again"
        self.remove_callbacks(self.fit_callbacks)
        self.switch_on()

    @with_cbs('fit', CancelFitException)
    def _fit(self, train, valid):
        for self.epoch in self.epochs:
            if train: self.one_pass(True)
            if valid: self.one_pass(False)
            self.run_callbacks('checkpoint', at='epoch')
            if self.stop_reason is not None: raise CancelFitException(self.stop_reason)

    def request_stop(self, reason:str): # why, for the record
        "End the fit after this epoch's `checkpoint` event, so that the savers write their checkpoints first"
        self.stop_reason = reason

    def one_pass(self, training:bool): # the training pass (`True`) or the validation pass
        "One pass over the training loader (the `train` phase) or the validation loader (`validate`)"
        self.model.train(training)
        self.dl, self.first_batch = (self.train_loader() if training else self.dls.valid), 0
        with torch.set_grad_enabled(training): (self._train if training else self._validate)()

    def train_loader(self): return self.dls.train  # the training pass's batches (a run measured in steps gives a stream)

    @with_cbs('train', CancelEpochException)
    def _train(self): self._batches()

    @with_cbs('validate', CancelEpochException)
    def _validate(self): self._batches()

    @with_cbs('epoch', CancelEpochException)
    def _batches(self):
        batches = iter(self.dl)
        for self.batch_num in itertools.count(self.first_batch):  # a resumed pass starts after the batches it had done
            self.run_callbacks('before_dataloader')
            if (batch := next(batches, _END)) is _END: break
            self.batch = batch
            self.run_callbacks('after_dataloader')
            self.one_batch()
            if self.model.training: self.run_callbacks('checkpoint', at='batch')

    @with_cbs('batch', CancelBatchException)
    def one_batch(self):
        "Process `self.batch`: predict and compute the loss; in training, backward, step and zero_grad. All callbacks"
        self.run_callbacks(_predict)
        if not self.model.training: return
        try: self.run_callbacks(_backward)
        except CancelBackwardException: pass
        try: self.run_callbacks(_step)
        except CancelStepException as e:  # no step: the gradients stay, and `step_skipped` says why
            return self.run_callbacks('step_skipped', reason=str(e) or f"cancelled by {getattr(e, 'raised_in', 'a callback')}")
        try: self.run_callbacks(_after_step)
        except CancelStepException: pass

    @with_cbs('scheduler_step')
    def step_scheduler(self, scheduler, # a torch learning-rate scheduler
                       metric=None): # the value a scheduler such as `ReduceLROnPlateau` steps with
        "Step `scheduler` (with `metric`, if given) in the `scheduler_step` phase"
        if metric is None: scheduler.step()
        else: scheduler.step(metric)

_END = object()
