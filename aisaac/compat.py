"""Other libraries' names: their hook names and step names with aisaac's event to use instead (so that a misnamed hook is an error that names the fix), ArcticTraining's `pre-`/`post-` spellings, and aisaac's own older names."""
__all__ = ['foreign_hooks', 'foreign_steps', 'arctic_event', 'runs_on', 'OtherNames']

def _foreign(names, event): return dict.fromkeys(names.split(), event)

_tr, _va = ' (in training: `trainer.training` is True)', ' (in validation: `trainer.training` is False)'
foreign_hooks = {  # Lightning, Cerebras, Keras, pytorch-accelerated, Composer and fastai hook names: the `Trainer`'s event
    **_foreign('on_fit_start on_train_start on_train_begin on_training_run_start fit_start', '`before_fit`'),
    **_foreign('on_fit_end on_train_end on_training_run_end fit_end', '`after_fit`'),
    **_foreign('on_train_epoch_start epoch_start', '`before_train`'), **_foreign('on_train_epoch_end epoch_end', '`after_train`'),
    **_foreign('on_epoch_start on_epoch_begin', '`before_epoch`'), **_foreign('on_epoch_end', '`after_epoch`'),
    **_foreign('on_validation_start on_validate_start on_validation_epoch_start on_eval_epoch_start on_test_begin eval_start', '`before_validate`'),
    **_foreign('on_validation_end on_validate_end on_validation_epoch_end on_eval_epoch_end on_test_end eval_end', '`after_validate`'),
    **_foreign('on_batch_begin on_batch_start batch_start', '`before_batch`'), **_foreign('on_batch_end batch_end', '`after_batch`'),
    **_foreign('on_train_batch_start on_train_batch_begin on_train_step_start before_train_batch', '`before_batch`' + _tr),
    **_foreign('on_train_batch_end on_train_step_end', '`after_batch`' + _tr),
    **_foreign('on_validation_batch_start on_validate_batch_start on_test_batch_begin on_eval_step_start eval_batch_start', '`before_batch`' + _va),
    **_foreign('on_validation_batch_end on_validate_batch_end on_test_batch_end on_eval_step_end eval_batch_end', '`after_batch`' + _va),
    **_foreign('on_before_forward before_forward', '`before_predict`'), **_foreign('on_after_forward after_forward after_pred', '`after_predict`'),
    **_foreign('on_before_backward', '`before_backward`'), **_foreign('on_after_backward', '`after_backward`'),
    **_foreign('on_before_optimizer_step', '`before_step`'), **_foreign('on_after_optimizer_step after_train_batch', '`after_step`'),
    **_foreign('on_before_zero_grad on_before_optimizer_zero_grad', '`before_zero_grad`'),
    **_foreign('on_after_optimizer_zero_grad', '`after_zero_grad`'),
    **_foreign('on_before_scheduler_step', '`before_scheduler_step`'), **_foreign('on_after_scheduler_step', '`after_scheduler_step`'),
    **_foreign('on_save_checkpoint batch_checkpoint epoch_checkpoint on_training_run_epoch_end', '`checkpoint` (its `at` argument says batch or epoch)'),
    **_foreign('on_init_end', '`after_create`'), **_foreign('on_stop_training_error', '`on_exception`'),
    **{f'after_cancel_{p}': f"`cleanup_{p}` (it always runs; `trainer.outcome == 'cancelled'` says it was cancelled)"
       for p in ('batch', 'epoch', 'train', 'validate', 'fit')},
}
foreign_steps = {'calculate_train_batch_loss': '`predict` and `get_loss`', 'calculate_eval_batch_loss': '`predict` and `get_loss`',
                 'training_step': '`predict` and `get_loss`', 'backward_step': '`backward`', 'optimizer_step': '`step`',
                 'optimizer_zero_grad': '`zero_grad`'}  # pytorch-accelerated's, Lightning's and Composer's names of the steps

def arctic_event(name:str): # an event's name, maybe in ArcticTraining's spelling
    "ArcticTraining's 'pre-step'/'post-step' as aisaac's 'before_step'/'after_step'; other names unchanged"
    for old, new in (('pre-', 'before_'), ('post-', 'after_')):
        if name.startswith(old): return new + name[len(old):].replace('-', '_')
    return name

def runs_on(cb): # a callback
    "Where `cb` runs in a distributed run: its `runs_on`, or 'main' for the older `main_process_only = True`"
    return 'main' if getattr(cb, 'main_process_only', False) is True else getattr(cb, 'runs_on', 'all')

class OtherNames:
    "A `Trainer` layer: other libraries' hook and step names, refused with the event to use (`aisaac.guards` reads them), and older names"
    foreign_hooks, foreign_steps = foreign_hooks, foreign_steps
    def one_epoch(self, training:bool): # the training pass (`True`) or the validation pass
        "miniai's and AIsaac's name for `one_pass`: one pass over the training or the validation loader"
        return self.one_pass(training)
