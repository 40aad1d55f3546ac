"""The trust boundary. Candidate code runs only in children started here (`parent.Sandbox`), and is
imported only in `child.py`. See ARCHITECTURE §4."""

from kbv.sandbox.parent import ChildFailure, ChildSpec, Sandbox
from kbv.sandbox.wire import SharedArena, TensorHandle

__all__ = ["ChildFailure", "ChildSpec", "Sandbox", "SharedArena", "TensorHandle"]
