"""The trainer's clock, and runs measured in optimizer steps: `fit(steps=1000, valid_every=200)` trains for that many steps across the loader's epochs, validating every `valid_every`."""
__all__ = ['StepRuns']
import math, numbers
from .core.dispatch import with_cbs
from .clock import Clock, Every, LoaderStream

def _count_batch(trainer):
    "A training batch starts: one micro-step, and its samples and tokens"
    if trainer.model.training and (batch := trainer.batch) is not None: trainer.clock.count(batch)

def _count_step(trainer): trainer.clock.step += 1  # an optimizer step was applied (`after_step` comes only then)

def _count_epoch(trainer):
    "A training pass went through the loader: one epoch of the data (a run in steps counts them in its stream)"
    if trainer.model.training and trainer.steps is None: trainer.clock.epoch += 1

for _f in (_count_batch, _count_step, _count_epoch): _f.hidden = True  # the trainer's own: not shown among the callbacks

class StepRuns:
    "A `Trainer` layer: `trainer.clock` counts epochs, applied steps, batches, samples, tokens and seconds; `fit(steps=...)` trains in steps; `step_scheduler`"
    events = ('before_data_epoch',)
    steps = valid_every = None
    def __init__(self, *args, **kwargs):
        self.clock = Clock()  # epochs, optimizer steps, batches, samples, tokens, seconds; kept across fits like the history
        super().__init__(*args, **kwargs)

    def handlers(self, event:str):
        "The handlers of `event`, after the clock's counting: a training batch (`before_predict`), a step (`after_step`), a pass (`after_epoch`)"
        hs = super().handlers(event)
        if (count := _counts.get(event)) is not None: return [(None, count, event)] + hs
        return hs

    def check_fit(self, steps:int=None, # train for this many optimizer steps instead of `n_epochs`
                  valid_every=None, # with `steps`: validate every this many steps
                  **args): # the rest of `fit`'s arguments
        "Refuse `steps` and `valid_every` that are not a run measured in steps"
        if steps is not None:
            if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
                raise ValueError(f"`steps` is how many optimizer steps to train, a whole number of 1 or more (got {steps!r})")
            if not args['train']: raise ValueError("`fit(steps=...)` trains for that many optimizer steps, and `train=False` trains none: leave `train` True")
        if valid_every is not None:
            if steps is None:
                raise ValueError("`valid_every` says when to validate in a run measured in steps: give `steps=` too (e.g. "
                                 "`fit(steps=1000, valid_every=200)`); a run of epochs validates after each epoch")
            if Every(valid_every).unit != 'step':
                raise ValueError(f"`valid_every` is a number of optimizer steps (got {valid_every!r}): e.g. `valid_every=200` or '200 steps'")
        super().check_fit(**args)

    def start_fit(self, steps:int=None, # train for this many optimizer steps instead of `n_epochs`
                  valid_every=None, # with `steps`: validate every this many steps
                  **args): # the rest of `fit`'s arguments
        "The passes of this fit: `n_epochs`, or passes of `valid_every` optimizer steps until `steps` are taken; the clock runs"
        self.steps, self._stream = steps, None
        self.valid_every = None if steps is None else steps if valid_every is None else int(Every(valid_every).n)
        super().start_fit(**args)
        if steps is not None:
            self.n_epochs = math.ceil(steps / self.valid_every)  # each turn of the loop validates after `valid_every` steps
            self.epochs, self._stream = range(self.n_epochs), LoaderStream(lambda: self.dls.train, self.clock, self._new_data_epoch)
            self.clock.fit_start_step = self.clock.step  # a resumed fit puts back the one of the fit it continues
        self.clock.start()

    def end_fit(self):
        "The clock stops counting the seconds"
        self.clock.stop()
        super().end_fit()

    def train_loader(self):
        "The training loader of this pass: `dls.train`, or in a run measured in steps the stream's batches until this pass's last step"
        if self.steps is None: return super().train_loader()
        return self._stream.until(self.clock.fit_start_step + min((self.epoch + 1) * self.valid_every, self.steps))

    def _new_data_epoch(self):
        "The stream starts an epoch of the training loader: the `before_data_epoch` event (a resumed run's handler may set where it starts)"
        self.run_callbacks('before_data_epoch')

    @with_cbs('scheduler_step')
    def step_scheduler(self, scheduler, # a torch learning-rate scheduler
                       metric=None): # the value a scheduler such as `ReduceLROnPlateau` steps with
        "Step `scheduler` (with `metric`, if given) in the `scheduler_step` phase: callbacks see it in `before_`/`after_scheduler_step`"
        if metric is None: scheduler.step()
        else: scheduler.step(metric)

    def planned_steps(self):
        "The optimizer steps this fit takes: `steps`, or its epochs times the training batches per epoch over `clock.batches_per_step`"
        if self.steps is not None: return self.steps
        try: n = len(self.dls.train)
        except TypeError:
            raise TypeError(f"The training loader ({type(self.dls.train).__name__}) has no len(), so the steps of a fit of {self.n_epochs} epochs "
                            f"are not known: fit with `steps=` instead, or give the scheduler its length") from None
        return self.n_epochs * math.ceil(n / self.clock.batches_per_step)

_counts = {'before_predict': _count_batch, 'after_step': _count_step, 'after_epoch': _count_epoch}
