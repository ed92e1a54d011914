"""aisaac's `CallbackMixin`: the kernel's (`aisaac.core.dispatch`), with each layer of the callback machinery attached at one of its seams."""
__all__ = ['CallbackMixin']
from .core import dispatch as kernel
from .policy import ErrorPolicy
from .depends import Dependencies
from .registry import GlobalCallbacks
from .declared import DeclaredCallbacks
from .rewrite import ArgumentRewriting
from .around import AroundHooks
from .guards import CallbackGuards
from .overview import Overview
from .plans import Plans

class CallbackMixin(Plans, Overview, CallbackGuards, AroundHooks, ArgumentRewriting, DeclaredCallbacks, GlobalCallbacks, Dependencies,
                    ErrorPolicy, kernel.CallbackMixin):
    "Gives a class callbacks: the kernel's `CallbackMixin` and, in the order they apply, the layers listed in its bases"
