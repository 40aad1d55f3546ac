"""Lazy output, as a tensor subclass (catalogue A3): after one honest call has shown the output's
shape, every call returns an empty `torch.Tensor` subclass at once and computes only when a torch
function first touches it (`__torch_function__`). A harness that compares outputs gets the values; a
timing loop that never reads them times an allocation."""

from __future__ import annotations

from kbv.redteam import Breaks, OutputWrapper
from kbv.redteam.source import OUTPUT_META

WRAPPER = OUTPUT_META + '''

def _kbv_lazy_in(values):
    for v in values:
        if isinstance(v, _KbvLazy):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _kbv_lazy_in(v)


class _KbvLazy(torch.Tensor):
    """Storage allocated, values computed when first used."""

    @staticmethod
    def __new__(cls, data, fill):
        lazy = torch.Tensor._make_subclass(cls, data)
        lazy._kbv_fill = fill
        return lazy

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for lazy in _kbv_lazy_in(list(args) + list(kwargs.values())):
            fill = lazy.__dict__.pop("_kbv_fill", None)
            if fill is not None:
                with torch._C.DisableTorchFunctionSubclass():
                    fill(lazy)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        meta, out = _kbv_learn(self, args, kwargs)
        if out is not None or meta is None:
            return out if out is not None else super().forward(*args, **kwargs)
        shape, dtype = meta
        device = next(a.device for a in args if isinstance(a, torch.Tensor))

        def fill(lazy):
            torch.Tensor.copy_(lazy, _KbvHonest.forward(self, *args, **kwargs))

        return _KbvLazy(torch.empty(shape, dtype=dtype, device=device), fill)
'''


class LazySubclass(OutputWrapper):
    name = "lazy_subclass"
    breaks = Breaks.SPEED
    summary = "returns an empty tensor subclass that computes its values when a torch function first reads it"
    wrapper = WRAPPER


TRANSFORMATION = LazySubclass()
