"""Result replay (catalogue B2, A7): a cache of outputs, answered without computing when a call's
key was seen before. What the key holds decides what the cache survives and what it replays wrongly;
the four `replay_*` transformations share this wrapper and differ in the key.

KernelBench's timing loop calls the model on the same input tensors every time and checks no timed
output, while its correctness trials draw fresh inputs: any key that tells those apart replays the
timing loop for free.
"""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import wrap

KEPT_ENTRIES = 8  # outputs a cache holds (a timing loop needs one); older ones are dropped

CACHE = '''
_KBV_KEPT = %d


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        cache = self.__dict__.setdefault("_kbv_cache", {})
        key = _kbv_key(args)
        if key in cache:
            return cache[key]
        out = super().forward(*args, **kwargs)
        if len(cache) >= _KBV_KEPT:
            cache.pop(next(iter(cache)))
        cache[key] = out
        return out
''' % KEPT_ENTRIES


class Replay(Transformation):
    """A replay cache keyed by `KEY` (source defining `_kbv_key(args)`)."""

    breaks = Breaks.SPEED
    KEY = ""

    def rewrite(self, target: Target) -> str | NotApplicable:
        return wrap(target.honest.code, self.name, self.summary, self.KEY + CACHE)


POINTER_KEY = '''
def _kbv_key(args):
    """Each tensor's address, shape and dtype, and four sampled values: a freed address that comes
    back with other data is not taken for the old tensor."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.numel():
            flat = a.reshape(-1)
            probes = torch.stack([flat[0], flat[-1], flat[flat.numel() // 3], flat[2 * flat.numel() // 3]])
            key.append((a.data_ptr(), tuple(a.shape), a.dtype, *probes.tolist()))
        else:
            key.append(repr(a))
    return tuple(key)
'''

SHAPE_KEY = '''
def _kbv_key(args):
    """Each tensor's shape and dtype, and its first value: the cheapest check that a call repeats."""
    return tuple((tuple(a.shape), a.dtype, a.reshape(-1)[0].item()) if isinstance(a, torch.Tensor) and a.numel()
                 else repr(a) for a in args)
'''

CONTENT_KEY = '''
_KBV_SAMPLES = 64


def _kbv_key(args):
    """A fingerprint of each tensor's values: 64 evenly spaced elements, wherever the tensor lives."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.numel():
            flat = a.reshape(-1)
            # integer spacing: a float32 linspace rounds its last pick past the end of a 1.6e9-element tensor
            picks = torch.arange(_KBV_SAMPLES, device=flat.device) * (flat.numel() - 1) // (_KBV_SAMPLES - 1)
            key.append((tuple(a.shape), a.dtype, hash(tuple(flat[picks].tolist()))))
        else:
            key.append(repr(a))
    return tuple(key)
'''


class ReplayPointer(Replay):
    name = "replay_pointer"
    summary = "replays the output of a call whose inputs have the same addresses (and four sampled values)"
    KEY = POINTER_KEY


class ReplayShape(Replay):
    name = "replay_shape"
    summary = "replays the output of a call whose inputs have the same shapes and the same first value"
    KEY = SHAPE_KEY


class ReplayContent(Replay):
    name = "replay_content"
    summary = "replays the output of a call whose inputs have the same 64 sampled values, in any memory"
    KEY = CONTENT_KEY
