"""The trust boundary, in one package. Candidate code runs only in children started here
(`parent.Sandbox`) and is imported only in `child.py`. Tensors cross through `channel` (device to
device with `vmm` on CUDA, shared memory on CPU) and commands and replies through `wire`. What runs
inside a child beside the candidate: `guards`, `integrity`, `timers`, `l2`, `memory`, `profiling`,
and `jit_cache` (what the candidate builds at import, built once by its build child and found by
the others). See ARCHITECTURE §4 and §15."""

from kbv.sandbox.parent import ChildFailure, ChildSpec, Sandbox, kill_all_children
from kbv.sandbox.wire import SharedArena, TensorHandle

__all__ = ["ChildFailure", "ChildSpec", "Sandbox", "SharedArena", "TensorHandle", "kill_all_children"]
