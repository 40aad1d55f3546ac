"""Runtime guards, installed in the child BEFORE candidate code is imported.

- an audit hook (it cannot be removed once added) records process creation, writes outside the
  allowed directories, network connections and dynamic library loads;
- a snapshot of the identities of timing, comparison and tensor primitives, compared after import and
  after every call (monkey-patching);
- thread counts, Python-level and OS-level, around each call;
- launch counters on the candidate's own kernels: the functions of every extension it builds through
  `torch.utils.cpp_extension.load_inline`/`load`, and every Triton `@jit` launch (attribution).

All of it is evidence for the parent; the parent decides. Toolchain processes (compilers, ninja,
ptxas, ldconfig) are allowed: building extensions and Triton kernels spawns them. So are the threads,
pool tasks and processes torch's compile machinery starts itself, judged by provenance
(`kbv.sandbox.code_origin`: the code that started them, the code they run, the command line a process
runs), never by name: `torch.compile` starts Inductor's compile pool, workers and probes. The tamper
table covers every function and class the harness's child-side modules define, found at install.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any

from kbv.sandbox.code_origin import Provenance

# Programs that builds and JIT compiles run. `file`: `platform.architecture()` runs `file -b` on the
# interpreter, and Triton's first compile in a process asks it (for its cache key); that compile can
# come at any call (a branch first taken late), not only at the first.
_TOOLCHAIN = ("ninja", "c++", "g++", "gcc", "cc", "clang", "clang++", "nvcc", "ptxas", "cicc", "fatbinary",
              "nvlink", "ld", "ld.gold", "ldconfig", "cuobjdump", "which", "uname", "hipcc", "as", "ar",
              "collect2", "cc1plus", "cc1", "cudafe++", "file")
_WRITE_MODES = ("w", "a", "x", "+")
# audit events of code being compiled or made: how a file name is forged (kbv.sandbox.code_origin)
_CODE_EVENTS = ("compile", "exec", "function.__new__", "code.__new__", "object.__setattr__")
_PROCESS_EVENTS = ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.fork", "os.forkpty", "os.system")

# The harness's child-side modules. Every function and class each defines (by its `__module__`, never a
# name it imports), and every method of those classes, is in the tamper table: found at install, so a
# helper added later is covered without a list to keep up to date.
HARNESS_MODULES = ("kbv.sandbox.timers", "kbv.sandbox.integrity", "kbv.sandbox.wire", "kbv.sandbox.memory",
                   "kbv.sandbox.own_kernels", "kbv.sandbox.elf", "kbv.sandbox.profiling", "kbv.sandbox.l2",
                   "kbv.sandbox.devicewatch", "kbv.sandbox.guards", "kbv.sandbox.code_origin", "kbv.sandbox.jit_cache")


def _protected(child_cls: type | None) -> dict[str, Callable[[], Any]]:
    """Name -> getter of everything whose identity and code the tamper check compares: timing,
    comparison and tensor primitives; everything `HARNESS_MODULES` define (imported here, before any
    candidate code), as `module.name` and `module.Class.method`; and the child's own module and
    `Child`'s methods (the child runs as __main__), as `child.name` and `Child.method`."""
    import importlib
    import json

    import torch

    table: dict[str, Callable[[], Any]] = {
        "time.perf_counter": lambda: time.perf_counter,
        "time.time": lambda: time.time,
        "time.monotonic": lambda: time.monotonic,
        "torch.allclose": lambda: torch.allclose,
        "torch.equal": lambda: torch.equal,
        "torch.isclose": lambda: torch.isclose,
        "torch.testing.assert_close": lambda: torch.testing.assert_close,
        "torch.Tensor.__eq__": lambda: torch.Tensor.__eq__,
        "torch.Tensor.copy_": lambda: torch.Tensor.copy_,
        "torch.Tensor.clone": lambda: torch.Tensor.clone,
        "torch.Tensor.detach": lambda: torch.Tensor.detach,
        "torch.Tensor.to": lambda: torch.Tensor.to,
        "torch.Tensor.cpu": lambda: torch.Tensor.cpu,
        "torch.cuda.synchronize": lambda: torch.cuda.synchronize,
        "torch.cuda.Event": lambda: torch.cuda.Event,
        "torch.cuda.Event.record": lambda: torch.cuda.Event.record,
        "torch.cuda.Event.elapsed_time": lambda: torch.cuda.Event.elapsed_time,
        "torch.cuda.Event.synchronize": lambda: torch.cuda.Event.synchronize,
        "json.dumps": lambda: json.dumps,
        "os.write": lambda: os.write,
    }
    for name in HARNESS_MODULES:
        # looked up in sys.modules at every check: a module replaced there is noticed too
        table.update(_definitions(importlib.import_module(name), name, functools.partial(sys.modules.get, name)))
    if child_cls is not None:
        module = sys.modules[child_cls.__module__]
        table.update(_definitions(module, "child", lambda: module, skip=child_cls))
        table.update(_methods(child_cls, "Child", lambda: child_cls))
    return table


def _definitions(module: Any, prefix: str, owner: Callable[[], Any], skip: Any = None) -> dict[str, Callable[[], Any]]:
    """Getters of the functions and classes `module` defines and of those classes' methods, named
    `prefix.name` and `prefix.Class.method`; `owner()` gives the module as it is now."""
    table: dict[str, Callable[[], Any]] = {}
    for name, obj in list(vars(module).items()):
        defined = isinstance(obj, (types.FunctionType, type)) or hasattr(obj, "__wrapped__")  # lru_cache'd too
        if obj is skip or not defined or getattr(obj, "__module__", None) != module.__name__:
            continue
        table[f"{prefix}.{name}"] = functools.partial(_member, owner, name)
        if isinstance(obj, type):
            table.update(_methods(obj, f"{prefix}.{name}", functools.partial(_member, owner, name)))
    return table


def _methods(cls: type, prefix: str, owner: Callable[[], Any]) -> dict[str, Callable[[], Any]]:
    return {f"{prefix}.{name}": functools.partial(_member, owner, name) for name, obj in list(vars(cls).items())
            if isinstance(obj, (types.FunctionType, staticmethod, classmethod, property))}


def _member(owner: Callable[[], Any], name: str) -> Any:
    """`name` in `owner()`'s own namespace: a class's raw attribute (a classmethod bound at each access
    would never be the same object twice)."""
    return vars(owner()).get(name)


def _code_of(obj: Any) -> Any:
    """The code object a protected function runs (of a static or class method, a property's getter, a
    cache's function), compared too: a function can keep its identity and change its body."""
    code = getattr(obj, "__code__", None)
    if code is None and not isinstance(obj, type):
        inner = getattr(obj, "__func__", None) or getattr(obj, "fget", None) or getattr(obj, "__wrapped__", None)
        code = getattr(inner, "__code__", None)
    return code


TIMER_NAMES = ("time.perf_counter", "time.time", "time.monotonic", "torch.cuda.synchronize", "torch.cuda.Event",
               "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time", "torch.cuda.Event.synchronize",
               "kbv.sandbox.timers.Clock", "kbv.sandbox.timers.time_block", "kbv.sandbox.timers.time_kernelbench",
               "kbv.sandbox.timers.warm_up", "kbv.sandbox.timers._call_ms", "kbv.sandbox.timers.subtract_costs",
               "kbv.sandbox.timers.measure_window_costs",
               "kbv.sandbox.timers.Window", "kbv.sandbox.timers.WindowCosts", "kbv.sandbox.timers._time_cuda_events",
               "kbv.sandbox.timers._time_host_synchronised", "kbv.sandbox.timers._time_do_bench",
               "kbv.sandbox.timers._do_bench_estimate", "kbv.sandbox.timers._time_host", "kbv.sandbox.timers._flush_ms",
               "Child.op_time_block", "Child.op_time", "Child.op_warmup", "Child.op_replay", "Child._window",
               "Child._window_costs", "Child._as_profiled",
               "kbv.sandbox.l2.PersistingL2")


MODE_PREFIX = "a torch mode left entered: "  # a tampered name: a mode on torch's stack after a call
OPERATOR_PREFIX = "aten operators given kernels of the candidate's: "  # a tampered name: `Guards.operators`


def _registered_at(line: str) -> str:
    """The file a line of the dispatcher's dump (`KEY: registered at FILE:LINE :: ...`) names, or ""."""
    _, found, rest = line.partition("registered at ")
    return rest.split(" :: ", 1)[0].rsplit(":", 1)[0] if found else ""


def _source_root(line: str) -> str:
    """The first three parts of the absolute path a dump line names (a build tree's root), or ""."""
    where = _registered_at(line)
    parts = where.split("/")
    return "/".join(parts[:4]) if where.startswith("/") and len(parts) > 4 else ""


def _foreign_registration(line: str, torch_dir: str, torch_sources: set[str]) -> bool:
    """Whether a dump line names a kernel registered from outside torch's own files: its package's
    Python files, or the build tree its C++ kernels came from (`torch_sources`)."""
    where = _registered_at(line)
    return bool(where) and not where.startswith(torch_dir + os.sep) and _source_root(line) not in torch_sources


def is_timer(name: str) -> bool:
    """Whether a tampered name is a timing primitive (timer_patch) rather than other harness code
    (harness_patch): one of TIMER_NAMES, a method of one (`kbv.sandbox.l2.PersistingL2.reset`), or
    one the clock bound itself (`Clock.perf_counter`)."""
    return name in TIMER_NAMES or name.rpartition(".")[0] in TIMER_NAMES or name.startswith("Clock.")


class Guards:
    """Child-side evidence collection. One instance per child, installed once."""

    def __init__(self, allowed_dirs: list[str]) -> None:
        self.allowed = [os.path.realpath(d) for d in allowed_dirs if d]
        self.events: list[tuple[str, str]] = []  # (category value, evidence)
        self.phase = "startup"
        self.ghost = False  # ghost replay: the candidate's own launches are suppressed
        # inside a timed loop the candidate's own launches are not counted: nothing reads the counts
        # there, and the count's clock and lock would be timed as the candidate's (microseconds a call)
        self.timed = False
        self.compiling = True  # until the first call returns: builds and JIT compilers spawn processes
        self.spawned_while_compiling: list[str] = []
        self.torch_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # torch's own (Provenance)
        self.provenance: Provenance | None = None
        self.launches: dict[str, int] = {}
        self.launch_s: dict[str, float] = {}
        self._lock = threading.Lock()
        self._snapshot: dict[str, Any] = {}
        import torch
        from torch.utils._device import DeviceContext

        c = torch._C  # torch's mode stacks' and dispatcher's readers (`modes`, `operators`), bound before any candidate import
        self._dispatcher = (c._dispatch_get_all_op_names, c._dispatch_dump, os.path.dirname(torch.__file__))
        self._aten = {n: c._dispatch_dump(n) for n in c._dispatch_get_all_op_names() if n.startswith("aten::")}
        # where torch's own C++ kernels were built (its build tree's root, as the dispatcher names it): a
        # kernel torch registers later (a library it loads lazily) comes from there too
        torch_dir = os.path.dirname(torch.__file__) + os.sep
        self._torch_sources = {_source_root(line) for dump in self._aten.values() for line in dump.splitlines()
                               if not _registered_at(line).startswith(torch_dir)} - {""}
        self._mode_stacks: tuple[Any, ...] | None = (
            c._len_torch_function_stack, c._get_function_stack_at, c._len_torch_dispatch_stack,
            c._get_dispatch_stack_at, c._get_dispatch_mode, tuple(c._TorchDispatchModeKey.__members__.values()),
            DeviceContext)
        self._device_context_fn = DeviceContext.__torch_function__  # torch's: a patched one runs the candidate's code
        self._getters: dict[str, Callable[[], Any]] = {}
        self._codes: dict[str, Any] = {}
        self._pools: set[type] = set()  # pool classes whose submit is checked

    # -- installation ---------------------------------------------------------------------------
    def install(self, child_cls: type | None = None) -> None:
        import torch

        self.provenance = Provenance(os.path.dirname(torch.__file__), self.allowed)
        self.snapshot(child_cls)
        sys.addaudithook(self._audit)
        self._wrap_extension_loaders()
        self._wrap_triton()
        self._wrap_thread_start()
        from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

        self._wrap_pool_submit(ThreadPoolExecutor)
        self._wrap_pool_submit(ProcessPoolExecutor)
        # a function can keep its identity and change its body: its code object is guarded too
        self._codes = {k: _code_of(v) for k, v in self._snapshot.items()}

    def snapshot(self, child_cls: type | None = None) -> None:
        """Bind the tamper table (`_protected`) and what it holds now, before any candidate code."""
        self._getters = _protected(child_cls)
        self._snapshot = {k: _safe(g) for k, g in self._getters.items()}
        self._codes = {k: _code_of(v) for k, v in self._snapshot.items()}

    def _wrap_thread_start(self) -> None:
        import _thread

        original = threading.Thread.start
        guards = self
        raw = _thread.start_new_thread

        @functools.wraps(raw)
        def start_new_thread(*args: Any, **kwargs: Any) -> Any:
            if guards.phase not in ("harness", "startup") and not guards._torch_raw_thread(args, sys._getframe(1)):
                guards._note("thread_injection", f"raw thread started during {guards.phase}")
            return raw(*args, **kwargs)

        _thread.start_new_thread = start_new_thread  # threading.Thread.start uses its own reference

        @functools.wraps(original)
        def start(thread: threading.Thread, *args: Any, **kwargs: Any) -> Any:
            if guards.phase != "harness" and guards.phase != "startup":
                if guards._torch_thread(thread, sys._getframe(1)):
                    guards.torch_threads.add(thread)  # Inductor's compile pool: not counted as the candidate's
                else:
                    guards._note("thread_injection", f"thread {thread.name!r} started during {guards.phase}")
            return original(thread, *args, **kwargs)

        threading.Thread.start = start  # type: ignore[method-assign]

    def _torch_thread(self, thread: threading.Thread, frame: Any) -> bool:
        try:
            return self.provenance is not None and self.provenance.torch_thread(thread, frame)
        except Exception:  # a thread the guard cannot read is not torch's
            return False

    def _torch_raw_thread(self, args: tuple[Any, ...], frame: Any) -> bool:
        try:
            return (self.provenance is not None and bool(args) and self.provenance.compile_started(frame)
                    and not self.provenance.hands_over_foreign(args[0], *args[1:3]))
        except Exception:
            return False

    def _wrap_pool_submit(self, pool_cls: type) -> None:
        """A task handed to a pool that is already running (Inductor's, started by torch) starts no
        thread or process: the task itself is checked, with the stack that handed it over."""
        if pool_cls in self._pools:
            return
        self._pools.add(pool_cls)
        original = pool_cls.submit
        guards = self
        torchs = self.provenance is not None and self.provenance.origin(original.__code__.co_filename) == "torch"

        @functools.wraps(original)
        def submit(pool: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            frame = sys._getframe(1)
            if guards.phase not in ("harness", "startup") and not guards._torch_task(fn, args, kwargs, frame, torchs):
                task = fn.func if isinstance(fn, functools.partial) else fn
                name = getattr(task, "__qualname__", None) or type(task).__name__
                guards._note("thread_injection", f"{name!r} handed to a {type(pool).__name__} during {guards.phase}")
            return original(pool, fn, *args, **kwargs)

        pool_cls.submit = submit  # type: ignore[attr-defined]

    def _torch_task(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], frame: Any, entered: bool) -> bool:
        try:
            return self.provenance is not None and self.provenance.torch_task(fn, args, kwargs, frame, entered)
        except Exception:
            return False

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        try:
            # these two in every phase: a finaliser of the candidate's can run during the harness's
            if event in _CODE_EVENTS:
                self._note_code(event, args, sys._getframe(1))
                return
            if event in _PROCESS_EVENTS:
                self._wrap_worker_pool()
            if self.phase == "harness":
                return
            if event == "open" and len(args) >= 2 and isinstance(args[1], str) and any(m in args[1] for m in _WRITE_MODES):
                self._check_write(args[0])
            elif event in ("os.remove", "os.rename", "os.rmdir", "shutil.rmtree", "os.truncate"):
                self._check_write(args[0])
            elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn"):
                self._check_process(args, sys._getframe(1))
            elif event in ("os.fork", "os.forkpty") and not self._compile_started(sys._getframe(1)):
                self._note("process_escape", f"{event} during {self.phase}")
            elif event == "os.system":  # a shell runs any command line: torch's compile machinery never asks for one
                self._note("process_escape", f"os.system({str(args[0])[:200]!r}) during {self.phase}")
            elif event == "socket.connect":
                self._note("process_escape", f"network connection to {args[1]!r} during {self.phase}")
        except Exception:  # an audit hook must never break the candidate's own call
            pass

    def _note_code(self, event: str, args: tuple[Any, ...], frame: Any) -> None:
        """Code compiled or made under a file name of torch's, the standard library's or a library's
        that is not that file's is forged (`Provenance.note_compiled`, `note_made`)."""
        if self.provenance is None:
            return
        if event == "compile":
            self.provenance.note_compiled(args[0], args[1], frame)
        elif event == "code.__new__":  # CodeType(...) or code.replace(...): (code bytes, filename, name, ...)
            self.provenance.note_made(args[1], frame)
        elif event in ("exec", "function.__new__"):  # exec/eval of a code object, FunctionType(code, ...)
            self.provenance.note_made(getattr(args[0], "co_filename", None), frame)
        elif args[1] == "__code__":  # object.__setattr__(function, "__code__", code)
            self.provenance.note_made(getattr(args[2], "co_filename", None), frame)

    def _check_write(self, path: Any) -> None:
        if isinstance(path, int):
            return
        real = os.path.realpath(os.fsdecode(path))
        if real.startswith(("/dev/", "/proc/self/", f"/proc/{os.getpid()}/")) or any(real == d or real.startswith(d + os.sep) for d in self.allowed):
            return
        self._note("file_write", f"write to {real} during {self.phase}")

    def _check_process(self, args: tuple[Any, ...], frame: Any) -> None:
        exe = args[0] if args else ""
        argv = args[1] if len(args) > 1 else None
        words = [os.fsdecode(a) for a in argv] if isinstance(argv, (list, tuple)) else (
            str(argv).split() if argv else [])
        path = os.fsdecode(exe) if isinstance(exe, (str, bytes, os.PathLike)) else (words[0] if words else "")
        name = os.path.basename(path.split()[0]) if path.strip() else ""
        if name in _TOOLCHAIN or name.startswith(("x86_64", "aarch64")):
            return
        if self.compiling:
            # import and the first call build extensions and JIT-compile kernels, which run toolchains
            # that differ from machine to machine; later calls have no reason to start anything
            self.spawned_while_compiling.append(" ".join(words)[:200] or path)
            return
        if self._torch_process(words or [path], frame):  # Inductor's workers and probes, at a recompile
            return
        self._note("process_escape", f"started process {' '.join(words)[:200] or path!r} during {self.phase}")

    def _wrap_worker_pool(self) -> None:
        """Inductor's compile-worker pool (`SubprocPool`) runs what it is handed in its worker
        process: its submit is checked like a thread pool's. Its module is torch's to import (late,
        and dear to import here); a pool exists only once its worker process has been started, so
        the first process started after that import wraps it."""
        module = sys.modules.get("torch._inductor.compile_worker.subproc_pool")
        pool_cls = getattr(module, "SubprocPool", None)
        if isinstance(pool_cls, type) and pool_cls not in self._pools:
            self._wrap_pool_submit(pool_cls)

    def _torch_process(self, words: list[str], frame: Any) -> bool:
        try:
            return (self.provenance is not None and self.provenance.torch_started(frame)
                    and self.provenance.torch_command(words))
        except Exception:
            return False

    def _compile_started(self, frame: Any) -> bool:
        try:
            return self.provenance is not None and self.provenance.compile_started(frame)
        except Exception:
            return False

    def _note(self, category: str, evidence: str) -> None:
        with self._lock:
            if len(self.events) < 50:
                self.events.append((category, evidence))

    # -- attribution counters -------------------------------------------------------------------
    def _wrap_extension_loaders(self) -> None:
        from torch.utils import cpp_extension

        for name in ("load_inline", "load"):
            original = getattr(cpp_extension, name)

            @functools.wraps(original)
            def loader(*args: Any, __original: Callable[..., Any] = original, **kwargs: Any) -> Any:
                module = __original(*args, **kwargs)
                return _CountingModule(module, self)

            setattr(cpp_extension, name, loader)
            self._snapshot[f"torch.utils.cpp_extension.{name}"] = loader
            self._getters[f"torch.utils.cpp_extension.{name}"] = functools.partial(getattr, cpp_extension, name)

    def _wrap_triton(self) -> None:
        classes = []
        try:
            from triton.runtime.jit import JITFunction
            classes.append(JITFunction)
            from triton.runtime.interpreter import (
                InterpretedFunction,  # TRITON_INTERPRET=1 (CPU)
            )
            classes.append(InterpretedFunction)
        except Exception:
            pass
        for cls in classes:
            cls.run = self._counting_run(cls.run)

    def _counting_run(self, original: Callable[..., Any]) -> Callable[..., Any]:
        guards = self

        @functools.wraps(original)
        def run(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            if guards.timed and not guards.ghost:  # first: nothing of the count's is timed
                return original(kernel, *args, **kwargs)
            fn = getattr(kernel, "fn", None)
            name = f"triton:{getattr(fn, '__name__', None) or '?'}"
            if guards.ghost:
                guards.count(name)  # a launch the ghost replay suppressed
                return None
            t0 = time.perf_counter()
            result = original(kernel, *args, **kwargs)  # a launch that raises is not a launch
            guards.count(name)
            guards.add_time(name, time.perf_counter() - t0)
            return result

        return run

    def count(self, name: str) -> None:
        with self._lock:
            self.launches[name] = self.launches.get(name, 0) + 1

    def add_time(self, name: str, seconds: float) -> None:
        with self._lock:
            self.launch_s[name] = self.launch_s.get(name, 0.0) + seconds

    # -- per call ---------------------------------------------------------------------------------
    def tampered(self, operators: bool = False) -> list[str]:
        """The harness's names replaced since install, and the modes left entered; with `operators`,
        the aten operators given kernels of the candidate's too (slower: after a checked call)."""
        out = []
        for name, getter in self._getters.items():
            now = _safe(getter)
            if now is not self._snapshot.get(name) or _code_of(now) is not self._codes.get(name):
                out.append(name)
        modes = self.modes()
        ops = self.operators() if operators else []
        return out + ([MODE_PREFIX + ", ".join(modes)] if modes else []) + ([OPERATOR_PREFIX + ", ".join(ops)] if ops else [])

    def operators(self) -> list[str]:
        """The aten operators the candidate registered a kernel of its own for (`torch.library`'s
        `Library("aten", "IMPL")`, or TORCH_LIBRARY_IMPL in an extension): every call of one runs
        its code, the harness's own copies and checks included. A registration torch makes itself
        (a file under torch's package: meta kernels, decompositions its compiler loads) is not one.
        Read from the dispatcher's tables, against those seen before any candidate import (tens of
        milliseconds: after a checked call, never inside timing)."""
        names, dump, torch_dir = self._dispatcher
        found = []
        for name in names():
            if not name.startswith("aten::"):
                continue
            now = dump(name)
            before = self._aten.get(name, "")
            if now == before:
                continue
            new = set(now.splitlines()) - set(before.splitlines())
            if any(_foreign_registration(line, torch_dir, self._torch_sources) for line in new):
                found.append(name)
        return sorted(found)

    def modes(self) -> list[str]:
        """The torch modes entered and left on the stack (read through torch's functions, bound at
        install): each runs code of its own on every tensor operation after it, the harness's
        included. torch's own `DeviceContext` (`torch.set_default_device`) only places new tensors."""
        if self._mode_stacks is None:
            return []
        function_len, function_at, dispatch_len, dispatch_at, infra, keys, device_context = self._mode_stacks
        found = [type(m).__name__ for m in (function_at(i) for i in range(function_len()))
                 if not (type(m) is device_context and device_context.__torch_function__ is self._device_context_fn
                         and "__torch_function__" not in getattr(m, "__dict__", {}))]
        found += [type(dispatch_at(i)).__name__ for i in range(dispatch_len())]
        found += [type(m).__name__ for m in (infra(k) for k in keys) if m is not None]
        return found

    def threads(self) -> tuple[int, int]:
        """(Python threads, OS threads of this process), less torch's own threads still alive (its
        compile pool's workers live on after the call that started them)."""
        own = sum(1 for t in list(self.torch_threads) if t.is_alive())
        try:
            os_threads = len(os.listdir("/proc/self/task")) - own
        except OSError:
            os_threads = -1
        return threading.active_count() - own, os_threads

    def report(self) -> dict[str, Any]:
        with self._lock:
            events = list(self.events)
        return {"events": events, "tampered": self.tampered(), "launches": dict(self.launches),
                "launch_s": dict(self.launch_s), "compile_processes": self.spawned_while_compiling[:10]}


class GhostCall(Exception):
    """Raised by an extension function during a ghost replay (it cannot return a fake result)."""


class _CountingModule:
    """A built extension whose functions count their calls (launches of the candidate's own code).
    A function's counting wrapper is made on its first access and kept on this object (later
    accesses find it without `__getattr__`); rebinding the name drops it."""

    def __init__(self, module: Any, guards: Guards) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_guards", guards)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        guards = self._guards
        label = f"ext:{getattr(self._module, '__name__', '?')}.{name}"

        @functools.wraps(attr)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if guards.ghost:
                raise GhostCall(label)
            if guards.timed:
                return attr(*args, **kwargs)
            t0 = time.perf_counter()
            result = attr(*args, **kwargs)  # a call that raises is not a launch
            guards.count(label)
            guards.add_time(label, time.perf_counter() - t0)
            return result

        object.__setattr__(self, name, counted)
        return counted

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in ("_module", "_guards"):
            self.__dict__.pop(name, None)
        setattr(self._module, name, value)

    def __delattr__(self, name: str) -> None:
        if name not in ("_module", "_guards"):
            self.__dict__.pop(name, None)
        delattr(self._module, name)

    def __dir__(self) -> list[str]:
        return dir(self._module)


def _safe(getter: Callable[[], Any]) -> Any:
    try:
        return getter()
    except Exception:
        return None
