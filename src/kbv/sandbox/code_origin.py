"""Whose code it is: a stack, a callable, a command line (`Provenance`, the rule behind the guards'
judgement of threads and processes, `kbv.sandbox.guards`).

Torch starts threads and processes of its own under `torch.compile`: Inductor's compile thread pool and
worker subprocess, its C++ compiler runs, its ISA probe, the hash of a preprocessed header, tqdm's
monitor behind max-autotune's progress bars. Those are not the candidate's. But every torch function
is the candidate's to call too, so torch's code on a stack proves little by itself:

- a thread or a pool task is torch's when torch's compile machinery asked for it: the innermost frame
  past the standard library and installed libraries is torch's, and beyond that starting frame, before
  the first frame of anyone else's, lies a frame of Inductor's or Dynamo's. A torch helper the
  candidate calls itself (`AsyncCompile.submit`) has none, and then whatever it hands over (a builtin,
  a partial, a ctypes callback, `list` over a `map`) is the candidate's. Under the compile machinery
  the code the thread or task runs is checked as well.
- a process is torch's when torch's code started it and its command line is one torch runs: the
  interpreter on Inductor's compile-worker entry, Inductor's ISA probe, the hash of a preprocessed
  header (toolchain programs are allowed whoever starts them: `kbv.sandbox.guards`).
- a file name is only as good as the code compiled under it. Code compiled under a file of torch's,
  the standard library's or a library's from a source that is not that file's, and code the
  candidate's own frame makes or runs under such a name, are forged: the name is the candidate's from
  then on. The user's site directory (the child's HOME is its work directory) and anything under the
  child's writable directories are never a library's.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import os
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

# the guards' own wrappers (of Thread.start, a pool's submit) are passed over like the standard library they wrap
_GUARDS = os.path.join(os.path.dirname(__file__), "guards.py")
_COMPILE_MACHINERY = ("_inductor", "_dynamo")
_WORKER_ENTRIES = (("_inductor", "compile_worker", "__main__.py"), ("_inductor", "__autotune_main__.py"))
_ISA_PROBE = (("_inductor", "cpu_vec_isa.py"), "VecISA", "_avx_py_load", "__lib_path__")
# what a thread or a task is handed besides its callable that may be code to run (not every callable:
# a pool's own worker gets a weakref, which is callable and no code of anyone's)
_CODE_TYPES = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial, ctypes._CFuncPtr)


class Provenance:
    """Whose code a stack, a callable or a command line is (see the module's docstring). `writable`:
    the child's own writable directories (never a library's)."""

    def __init__(self, torch_dir: str, writable: Sequence[str] = ()) -> None:
        import site
        import sysconfig

        paths = sysconfig.get_paths()
        self.stdlib = tuple({os.path.join(paths[k], "") for k in ("stdlib", "platstdlib")})
        self.writable = tuple(os.path.join(os.path.realpath(d), "") for d in writable if d)
        # where libraries are installed, never a name alone: a candidate's `$TMPDIR/site-packages/x.py` is its own
        sites = {p for d in (paths["purelib"], paths["platlib"], *site.getsitepackages())
                 for p in (d, os.path.realpath(d))}
        self.libraries = tuple(os.path.join(p, "") for p in sites)
        self.torch = os.path.join(torch_dir, "")
        self.compile_machinery = tuple(os.path.join(torch_dir, d, "") for d in _COMPILE_MACHINERY)
        self.kbv = os.path.join(os.path.dirname(os.path.dirname(__file__)), "")  # installed or not: not a library
        self.interpreter = os.path.realpath(sys.executable)  # as at the start: the candidate can rebind sys.executable
        self.worker_entries = tuple(os.path.join(torch_dir, *p) for p in _WORKER_ENTRIES)
        self.forged: set[str] = set()  # file names the candidate's code was compiled or made under
        self._probe: tuple[str, str] | None = None  # Inductor's ISA probe around its library path, once read

    def origin(self, filename: str) -> str:
        """'torch', 'stdlib', 'library' or 'other' for a code object's `co_filename`."""
        if filename in self.forged:
            return "other"
        if filename.startswith(self.torch):
            return "torch"
        if filename.startswith(self.kbv) or filename.startswith(self.writable):
            return "other"
        if filename.startswith(self.libraries):
            return "library"
        if filename.startswith("<frozen ") or filename.startswith(self.stdlib):
            return "stdlib"
        return "other"

    # -- stacks -----------------------------------------------------------------------------------
    def torch_started(self, frame: Any) -> bool:
        """Whether the innermost frame of `frame`'s stack that is neither the standard library's nor
        another library's is torch's: torch asked (itself, or through a library it calls), not the
        candidate calling threading, subprocess or a library itself."""
        while frame is not None:
            filename = frame.f_code.co_filename
            origin = self.origin(filename)
            if origin == "torch":
                return True
            if origin == "other" and filename != _GUARDS:
                return False
            frame = frame.f_back
        return False

    def compile_started(self, frame: Any, entered: bool = False) -> bool:
        """Whether torch's compile machinery asked: torch started it (`torch_started`), and beyond
        that starting frame, before the first frame of anyone else's, lies a frame of Inductor's or
        Dynamo's. A torch helper the candidate calls itself has none beyond its own. `entered`: the
        starting frame is torch's own and not on this stack (a torch pool's submit, wrapped), so
        the first of torch's frames here already counts: Inductor's generated module (its file is
        in a cache the candidate can write, so anyone else's) calls `AsyncCompile.triton`, which
        hands its compile to the worker pool itself."""
        started = entered
        while frame is not None:
            filename = frame.f_code.co_filename
            origin = self.origin(filename)
            if origin == "other" and filename != _GUARDS:
                return False
            if origin == "torch":
                if started and filename.startswith(self.compile_machinery):
                    return True
                started = True
            frame = frame.f_back
        return False

    # -- callables --------------------------------------------------------------------------------
    def foreign(self, fn: Any) -> bool:
        """Whether `fn` (a thread's target or run, a pool task) runs code of neither torch, the
        standard library nor another installed library. A partial is as foreign as its function or
        any code among its arguments; a ctypes function pointer (a callback into anyone's code) is
        foreign; bound methods are unwrapped; a callable without Python code (a builtin, an
        extension's function) is judged by its module (a builtin method by its object's type's)."""
        if isinstance(fn, functools.partial):
            return self.hands_over_foreign(fn.func, fn.args, fn.keywords)
        if isinstance(fn, ctypes._CFuncPtr):
            return True
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None) or getattr(getattr(type(fn), "__call__", None), "__code__", None)
        if code is not None:
            return self.origin(code.co_filename) == "other"
        # a builtin method has no module of its own: its object's type has (`contextvars.Context.run`)
        owner = getattr(fn, "__module__", None) or (type(fn.__self__).__module__ if hasattr(fn, "__self__") else None)
        module = sys.modules.get(str(owner or "").split(".")[0])
        if module is None:
            return True
        if module.__name__ in sys.stdlib_module_names:  # builtins, time: no file of their own
            return False
        return self.origin(str(getattr(module, "__file__", None) or "")) == "other"

    def hands_over_foreign(self, fn: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> bool:
        """Whether `fn` called with `args` and `kwargs` runs foreign code: `fn` itself, or code among
        its arguments (`operator.call` handed the candidate's function)."""
        handed = (*args, *(kwargs or {}).values())
        return self.foreign(fn) or any(self.foreign(a) for a in handed if isinstance(a, _CODE_TYPES))

    def torch_thread(self, thread: threading.Thread, frame: Any) -> bool:
        """Whether `thread`, being started from `frame`, is torch's own: started by torch's compile
        machinery, running no code of the candidate's."""
        run = type(thread).run
        target = getattr(thread, "_target", None)
        return (self.compile_started(frame) and (run is threading.Thread.run or not self.foreign(run))
                and (target is None or not self.hands_over_foreign(target, getattr(thread, "_args", ()),
                                                                   getattr(thread, "_kwargs", None))))

    def torch_task(self, fn: Any, args: Sequence[Any], kwargs: dict[str, Any], frame: Any,
                   entered: bool = False) -> bool:
        """Whether a task handed to a pool's submit from `frame` is torch's own: handed over by torch's
        compile machinery, running no code of the candidate's. `entered`: the submit is torch's own
        (`compile_started`)."""
        return self.compile_started(frame, entered) and not self.hands_over_foreign(fn, args, kwargs)

    # -- processes --------------------------------------------------------------------------------
    def torch_command(self, words: Sequence[str]) -> bool:
        """Whether a command line is one torch's Inductor runs itself, by its shape: the interpreter
        on Inductor's compile-worker (or autotune) entry with options only, the interpreter running
        Inductor's ISA probe on a shared object, `openssl sha512 FILE` (a preprocessed header's hash)."""
        if not words:
            return False
        if os.path.basename(words[0]) == "openssl":
            return len(words) == 3 and words[1] == "sha512"
        if os.path.realpath(words[0]) != self.interpreter or len(words) < 2:
            return False
        if words[1] in self.worker_entries:
            return all(w.startswith("--") for w in words[2:])
        return len(words) == 3 and words[1] == "-c" and self._isa_probe(words[2])

    def _isa_probe(self, code: str) -> bool:
        """Whether `code` is Inductor's ISA probe (read from torch's own file, never from the class
        the candidate could change) with a shared object's path put in, a path that cannot leave its
        string literal."""
        if self._probe is None:
            self._probe = _read_probe(os.path.join(self.torch, *_ISA_PROBE[0])) or ("\0", "\0")
        head, tail = self._probe
        if len(code) < len(head) + len(tail) or not (code.startswith(head) and code.endswith(tail)):
            return False
        path = code[len(head):len(code) - len(tail)]
        return path.endswith(".so") and not any(c in path for c in "\"'\\\n")

    # -- forged file names ------------------------------------------------------------------------
    def note_compiled(self, source: Any, filename: Any, frame: Any) -> None:
        """The audit hook's `compile` event, called for by `frame`'s code: source compiled under a file
        name of torch's, the standard library's or a library's is forged unless it is that file's
        content on disk (an import, torch's own lazy ones included, compiles the file itself), or torch's
        own code compiled it under a name that is no file (torch's code generators name their code
        `<its file>:codegen(...)`). An AST compiled has no file name here: the code made of it is
        judged where it is used (`note_made`)."""
        if not isinstance(filename, str) or self.origin(filename) == "other":
            return
        data = source.encode() if isinstance(source, str) else source
        try:
            with open(filename, "rb") as f:
                genuine = isinstance(data, (bytes, bytearray)) and f.read() == data
        except OSError:
            genuine = frame is not None and self.origin(frame.f_code.co_filename) == "torch"
        if not genuine:
            self.forged.add(filename)

    def note_made(self, filename: Any, frame: Any) -> None:
        """Code under `filename` that `frame`'s code made or ran itself (a code object made or
        replaced, a function made from one, exec or eval of one, a function's code set): forged when
        the frame is the candidate's (anyone else's but kbv's) and the name is torch's, the standard
        library's or a library's. Imports and torch's own code transformations are never the
        candidate's frame."""
        if not isinstance(filename, str) or frame is None or self.origin(filename) == "other":
            return
        caller = frame.f_code.co_filename
        if self.origin(caller) == "other" and not caller.startswith(self.kbv):
            self.forged.add(filename)


def _read_probe(path: str) -> tuple[str, str] | None:
    """Inductor's ISA probe source (`VecISA._avx_py_load`) in `path`, split around its library path."""
    _, cls_name, attr, marker = _ISA_PROBE
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name):
        for node in cls.body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets)
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                    and node.value.value.count(marker) == 1):
                head, tail = node.value.value.split(marker)
                return head, tail
    return None
