"""The kernel's words: the loop's `event`s, the `Cancel` exceptions that end part of it, and `Callback`, which declares every setting a callback can have."""
__all__ = ['event', 'CancelException', 'CancelFitException', 'CancelEpochException', 'CancelBatchException', 'CancelBackwardException',
           'CancelStepException', 'PreemptedException', 'Callback', 'setting']

class event:
    """The events of the `Trainer`'s loop, as attributes (`event.before_fit`) and in `event.names`, in the order the loop fires them:

        Trainer(...)                               after_create
        fit(n_epochs, lr)                          before_fit
          for epoch in epochs:
            training pass                          before_train, before_epoch
              for each batch:                      before_dataloader, (the loader's next batch), after_dataloader
                one_batch                          before_batch
                  the model                        before_predict, predict, after_predict
                  the loss                         before_loss, get_loss, after_loss
                  the gradients                    before_backward, backward, after_backward
                  the optimizer                    before_step, step, then after_step if a step was applied, else step_skipped
                  zeroing                          before_zero_grad, zero_grad, after_zero_grad
                                                   after_batch, cleanup_batch
                                                   checkpoint (at='batch')
                                                   after_epoch, cleanup_epoch, after_train, cleanup_train
            validation pass                        the same from before_validate to cleanup_validate, with the model and the loss only
                                                   checkpoint (at='epoch'); then `request_stop` ends the fit
                                                   after_fit, cleanup_fit; on_exception if the fit failed

    A phase's `after_` event runs when it ended normally; its `cleanup_` event always runs, with `trainer.outcome` saying how it ended."""
    names = tuple('''after_create before_fit before_train before_validate before_epoch before_dataloader after_dataloader before_batch
                     before_predict predict after_predict before_loss get_loss after_loss before_backward backward after_backward
                     before_step step step_skipped after_step before_zero_grad zero_grad after_zero_grad after_batch cleanup_batch checkpoint
                     after_epoch cleanup_epoch after_train cleanup_train after_validate cleanup_validate after_fit cleanup_fit on_exception'''.split())
for _name in event.names: setattr(event, _name, _name)

class CancelException(Exception):                "Base of the exceptions that end part of the loop early; never reported as errors"
class CancelFitException(CancelException):      "Raise in a handler to end the fit: `after_fit` is skipped, `cleanup_fit` runs"
class CancelEpochException(CancelException):    "Raise in a handler to end this pass: `after_epoch` is skipped, `cleanup_epoch` runs"
class CancelBatchException(CancelException):    "Raise in a handler to skip the rest of this batch: `after_batch` is skipped, `cleanup_batch` runs"
class CancelBackwardException(CancelException): "Raise in `before_backward` or `backward` to skip this batch's backward pass and `after_backward`"
class CancelStepException(CancelException):     "Raise from `before_step` to `zero_grad` to skip this batch's optimizer step and the zeroing of the gradients"
class PreemptedException(CancelFitException):
    "The fit ends because the job is being stopped from outside (SIGTERM), after a checkpoint: its outcome is `'preempted'`"
    outcome = 'preempted'

class Callback:
    "Optional base class of callbacks (any object with methods named after events is one); the settings a callback may declare:"
    order = 0                    # callbacks run sorted by `order`; among equal ones, core callbacks first, then in the order added
    core = False                 # it does a step of the loop (`BasicTrainCB`)
    callbacks = ()               # a group's members, added and removed with it
    custom_events = ()           # events of its own that it fires or handles, besides the trainer's
    on_error = 'raise'           # when one of its handlers fails: 'raise', 'warn' (switched off for the rest of the fit) or 'ignore'
    must_start = False           # a failure in `before_fit` ends the fit whatever `on_error` says (a logger that cannot start)
    runs_on = 'all'              # in a distributed fit: on 'all' processes, the 'main' one only, or 'collective' (it talks to the others)
    run_after = run_before = ()  # callbacks (classes or class names) it runs after / before at every event: they win over `order`
    needs = ()                   # trainer attributes or history metrics it reads, checked when a fit starts
    provides = None              # the names it sets (globs allowed); `None`: unsaid
    def __repr__(self): return f'{type(self).__name__}()'
    def state_dict(self): "Its state, for checkpoints: none, unless a subclass keeps one"; return {}
    def load_state_dict(self, state:dict): # as `state_dict` made it
        "Load `state`; without a `load_state_dict` of its own, a callback accepts only the empty state"
        if state: raise NotImplementedError(f"{type(self).__name__} cannot load the state {list(state)}: it has no `load_state_dict` of "
                                            f"its own. Define one that restores what its `state_dict` returns.")

def setting(cb, name:str): # a callback (a `Callback` or any object with hooks) and the name of a setting
    "`cb`'s setting `name`, or `Callback`'s default when `cb` does not declare it"
    return getattr(cb, name, getattr(Callback, name))
