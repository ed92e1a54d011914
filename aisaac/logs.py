"""What callbacks record and where it goes: the trainer's run history, and `log`, `log_image` and `log_text`, which send values, images and texts to the logger callbacks."""
__all__ = ['Logging']
import torch
from .history import RunHistory

def _numbers(metrics):
    "A copy of `metrics` with tensors read to Python numbers"
    return {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}

class Logging:
    "A `Trainer` layer: `trainer.history` keeps every metric; `trainer.log` sends values to the loggers, which decide where they go"
    events = ('log', 'log_image', 'log_text', 'log_metrics')
    def __init__(self, *args, **kwargs):
        self.history = RunHistory()  # kept across fits: `trainer.history.reset()` starts afresh
        super().__init__(*args, **kwargs)

    def log(self, metrics:dict, # {name: number}; one-element tensors are read to numbers
            step:int=None, # the epoch or batch the values belong to; `None`: each logger numbers them in turn
            per:str='epoch'): # `'epoch'` or `'batch'`
        "Send `metrics` to every logger callback that wants values logged `per` epoch or batch, through the `log` event"
        if not isinstance(metrics, dict):
            raise TypeError(f"`metrics` must be a dict of {{name: number}} (got {type(metrics).__name__}): e.g. `trainer.log({{'lr': 0.01}})`")
        if (key := _keys.get(per)) is None: raise ValueError(f"`per` must be 'epoch' or 'batch' (got {per!r})")
        if (plan := self.plans.get(key)) is None:  # the `log` handlers that want values `per` epoch or batch (a logger's `wants`)
            plan = self.plans[key] = tuple(h for h in self.dispatch('log') if not callable(w := getattr(h[0], 'wants', None)) or w(per))
        if not plan: return  # no logger wants them: nothing to read or copy
        self.run_callbacks(key, metrics=_numbers(metrics), step=step, per=per)

    def log_image(self, name:str, # what the image shows, e.g. `'predictions'`
                  image, # a matplotlib `Figure`, or an array or tensor: HxW, HxWxC (channels last) or CxHxW, floats in [0, 1] or `uint8`
                  step:int=None): # the epoch it belongs to
        "Send `image` to every logger callback that takes images, through the `log_image` event"
        self.run_callbacks('log_image', name=name, image=image, step=step)

    def log_text(self, name:str, # what the text is, e.g. `'sample'`
                 text:str, # the text
                 step:int=None): # the optimizer step (or epoch) it belongs to
        "Send `text` to every logger callback that takes text (and the progress display), through the `log_text` event"
        if not isinstance(text, str): raise TypeError(f"`text` must be a string (got {type(text).__name__})")
        self.run_callbacks('log_text', name=name, text=text, step=step)

_keys = {'epoch': ('log', 'epoch'), 'batch': ('log', 'batch')}  # the plans of `log` for values per epoch and per batch
