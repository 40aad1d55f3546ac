"""Runtime guards, installed in the child BEFORE candidate code is imported.

- an audit hook (it cannot be removed once added) records process creation, writes outside the
  allowed directories, network connections and dynamic library loads;
- a snapshot of the identities of timing, comparison and tensor primitives, compared after import and
  after every call (monkey-patching);
- thread counts, Python-level and OS-level, around each call;
- launch counters on the candidate's own kernels: the functions of every extension it builds through
  `torch.utils.cpp_extension.load_inline`/`load`, and every Triton `@jit` launch (attribution).

All of it is evidence for the parent; the parent decides. Toolchain processes (compilers, ninja,
ptxas, ldconfig) are allowed: building extensions and Triton kernels spawns them. So are the threads
and processes torch starts itself, judged by provenance (`Provenance`: the code that started them,
and the code they run), never by name: `torch.compile` starts Inductor's compile pool and workers.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

# Programs that builds and JIT compiles run. `file`: `platform.architecture()` runs `file -b` on the
# interpreter, and Triton's first compile in a process asks it (for its cache key); that compile can
# come at any call (a branch first taken late), not only at the first.
_TOOLCHAIN = ("ninja", "c++", "g++", "gcc", "cc", "clang", "clang++", "nvcc", "ptxas", "cicc", "fatbinary",
              "nvlink", "ld", "ld.gold", "ldconfig", "cuobjdump", "which", "uname", "hipcc", "as", "ar",
              "collect2", "cc1plus", "cc1", "cudafe++", "file")
_WRITE_MODES = ("w", "a", "x", "+")

def _protected(child_cls: type | None) -> dict[str, Callable[[], Any]]:
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
    if "kbv.sandbox.l2" in sys.modules:  # the persisting-L2 control's methods (bound when the clock was made)
        for name in ("reset", "state"):
            table[f"kbv.sandbox.l2.PersistingL2.{name}"] = functools.partial(
                lambda n: getattr(sys.modules["kbv.sandbox.l2"].PersistingL2, n), name)
    if child_cls is not None:  # the harness's own command handlers (the child runs as __main__)
        module = sys.modules[child_cls.__module__]
        for name in ("reply", "op_forward", "op_time", "op_time_block", "op_memory", "op_attribution", "op_bandwidth",
                     "op_warmup", "op_replay", "_window", "_copy_out", "_inputs"):
            table[f"Child.{name}"] = functools.partial(lambda n: getattr(child_cls, n), name)
        for name in ("serve", "_error_reply"):
            table[f"child.{name}"] = functools.partial(lambda n: getattr(module, n), name)
    for mod, names in (("kbv.sandbox.timers", ("time_block", "time_kernelbench", "warm_up", "copy_bandwidth",
                                               "_call_ms", "measure_window_costs", "Window", "WindowCosts",
                                               "_time_cuda_events", "_time_host_synchronised", "_time_do_bench",
                                               "_time_host", "_flush_ms")),
                       # what says whose kernels ran (attribution) and what a model holds (memory)
                       ("kbv.sandbox.provenance", ("own_kernels", "candidate_libraries", "triton_kernels",
                                                   "mapped_files")),
                       ("kbv.sandbox.elf", ("kernel_entries", "read_symbols")),
                       ("kbv.sandbox.profiling", ("profile_forward", "_device_kernels")),
                       ("kbv.sandbox.integrity", ("changed", "overlapping", "snapshot", "describe_output", "write_late",
                                                  "unjoined_work", "state_print")),
                       ("kbv.sandbox.wire", ("send_reply", "write_frame", "map_tensor")),
                       ("kbv.sandbox.memory", ("measure_forward", "with_first_call", "held_since", "read_levels",
                                               "first_call_window", "FirstCall"))):
        for name in names:
            table[f"{mod}.{name}"] = functools.partial(lambda m, n: getattr(sys.modules[m], n), mod, name)
    return table


TIMER_NAMES = ("time.perf_counter", "time.time", "time.monotonic", "torch.cuda.synchronize", "torch.cuda.Event",
               "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time", "torch.cuda.Event.synchronize",
               "kbv.sandbox.timers.time_block", "kbv.sandbox.timers.time_kernelbench", "kbv.sandbox.timers.warm_up",
               "kbv.sandbox.timers._call_ms", "kbv.sandbox.timers.measure_window_costs", "kbv.sandbox.timers.Window",
               "kbv.sandbox.timers.WindowCosts", "kbv.sandbox.timers._time_cuda_events",
               "kbv.sandbox.timers._time_host_synchronised", "kbv.sandbox.timers._time_do_bench",
               "kbv.sandbox.timers._time_host", "kbv.sandbox.timers._flush_ms", "Child.op_time_block", "Child.op_time", "Child.op_warmup",
               "Child.op_replay", "Child._window", "kbv.sandbox.l2.PersistingL2.reset", "kbv.sandbox.l2.PersistingL2.state")


def is_timer(name: str) -> bool:
    return name in TIMER_NAMES or name.startswith("Clock.")


class Provenance:
    """Whose code a stack or a callable is, by the file its code was compiled from: torch's own
    package's, the standard library's, another installed library's (site-packages: tqdm, Triton), or
    anyone else's (the candidate's file, code it exec'd or wrote, kbv itself). Torch starts threads
    and processes of its own (Inductor's compile thread pool and worker subprocesses, its C++
    compiler runs, its ISA probes, tqdm's monitor behind max-autotune's progress bars) when the
    candidate calls `torch.compile` or a compiled function; those are not the candidate's.

    A torch helper the candidate calls directly passes the stack rule too, so what a thread runs is
    checked as well: a target or a pool task of anyone else's code is the candidate's. TODO: a
    process torch's code starts on a command line the candidate chose (a helper called with its own
    argv) would pass; we know of no such use in the wild."""

    def __init__(self, torch_dir: str) -> None:
        import site
        import sysconfig

        paths = sysconfig.get_paths()
        self.stdlib = tuple({os.path.join(paths[k], "") for k in ("stdlib", "platstdlib")})
        # where libraries are installed, never a name alone: a candidate's `$TMPDIR/site-packages/x.py` is its own
        sites = [paths["purelib"], paths["platlib"], *site.getsitepackages(), site.getusersitepackages()]
        self.libraries = tuple({os.path.join(p, "") for d in sites for p in (d, os.path.realpath(d))})
        self.torch = os.path.join(torch_dir, "")
        self.kbv = os.path.join(os.path.dirname(os.path.dirname(__file__)), "")  # installed or not: not a library

    def origin(self, filename: str) -> str:
        """'torch', 'stdlib', 'library' or 'other' for a code object's `co_filename`."""
        if filename.startswith(self.torch):
            return "torch"
        if filename.startswith(self.kbv):
            return "other"
        if filename.startswith(self.libraries):
            return "library"
        if filename.startswith("<frozen ") or filename.startswith(self.stdlib):
            return "stdlib"
        return "other"

    def torch_started(self, frame: Any) -> bool:
        """Whether the innermost frame of `frame`'s stack that is neither the standard library's nor
        another library's is torch's: torch asked for the thread or process (itself, or through a
        library it calls), not the candidate calling threading, subprocess or a library itself.
        The guards' own wrappers (of `ThreadPoolExecutor.submit`, say) are passed over like the
        standard library they wrap."""
        while frame is not None:
            filename = frame.f_code.co_filename
            origin = self.origin(filename)
            if origin == "torch":
                return True
            if origin == "other" and filename != __file__:
                return False
            frame = frame.f_back
        return False

    def foreign(self, fn: Any) -> bool:
        """Whether `fn` (a thread's target or run, a pool task) runs code of neither torch, the
        standard library nor another installed library. Partials and bound methods are unwrapped; a
        callable without Python code (a builtin, an extension's function) is judged by its module."""
        while isinstance(fn, functools.partial):
            fn = fn.func
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None) or getattr(getattr(type(fn), "__call__", None), "__code__", None)
        if code is not None:
            return self.origin(code.co_filename) == "other"
        module = sys.modules.get(str(getattr(fn, "__module__", None) or "").split(".")[0])
        if module is None:
            return True
        if module.__name__ in sys.stdlib_module_names:  # builtins, time: no file of their own
            return False
        return self.origin(str(getattr(module, "__file__", None) or "")) == "other"

    def torch_thread(self, thread: threading.Thread, frame: Any) -> bool:
        """Whether `thread`, being started from `frame`, is torch's own: started by torch's code,
        running no code of the candidate's."""
        run = type(thread).run
        target = getattr(thread, "_target", None)
        return (self.torch_started(frame) and (run is threading.Thread.run or not self.foreign(run))
                and (target is None or not self.foreign(target)))


class Guards:
    """Child-side evidence collection. One instance per child, installed once."""

    def __init__(self, allowed_dirs: list[str]) -> None:
        self.allowed = [os.path.realpath(d) for d in allowed_dirs if d]
        self.events: list[tuple[str, str]] = []  # (category value, evidence)
        self.phase = "startup"
        self.ghost = False  # ghost replay: the candidate's own launches are suppressed
        self.compiling = True  # until the first call returns: builds and JIT compilers spawn processes
        self.spawned_while_compiling: list[str] = []
        self.torch_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # torch's own (Provenance)
        self.provenance: Provenance | None = None
        self.launches: dict[str, int] = {}
        self.launch_s: dict[str, float] = {}
        self._lock = threading.Lock()
        self._snapshot: dict[str, Any] = {}
        self._getters: dict[str, Callable[[], Any]] = {}

    # -- installation ---------------------------------------------------------------------------
    def install(self, child_cls: type | None = None) -> None:
        import torch

        import kbv.sandbox.elf  # noqa: F401
        import kbv.sandbox.integrity  # noqa: F401
        import kbv.sandbox.memory  # noqa: F401  (bound before the candidate can reach it)
        import kbv.sandbox.profiling  # noqa: F401
        import kbv.sandbox.provenance  # noqa: F401
        import kbv.sandbox.timers  # noqa: F401

        self.provenance = Provenance(os.path.dirname(torch.__file__))
        self._getters = _protected(child_cls)
        self._snapshot = {k: _safe(g) for k, g in self._getters.items()}
        sys.addaudithook(self._audit)
        self._wrap_extension_loaders()
        self._wrap_triton()
        self._wrap_thread_start()
        self._wrap_pool_submit()
        # a function can keep its identity and change its body: its code object is guarded too
        self._codes = {k: getattr(v, "__code__", None) for k, v in self._snapshot.items()}

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
            return (self.provenance is not None and bool(args) and self.provenance.torch_started(frame)
                    and not self.provenance.foreign(args[0]))
        except Exception:
            return False

    def _wrap_pool_submit(self) -> None:
        """A task the candidate hands to a thread pool that is already running (Inductor's, started
        by torch) starts no thread: the task itself is checked."""
        from concurrent.futures import ThreadPoolExecutor

        original = ThreadPoolExecutor.submit
        guards = self

        @functools.wraps(original)
        def submit(pool: ThreadPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            if guards.phase not in ("harness", "startup") and guards._foreign(fn):
                task = fn.func if isinstance(fn, functools.partial) else fn
                name = getattr(task, "__qualname__", None) or type(task).__name__
                guards._note("thread_injection", f"{name!r} handed to a thread pool during {guards.phase}")
            return original(pool, fn, *args, **kwargs)

        ThreadPoolExecutor.submit = submit  # type: ignore[method-assign]

    def _foreign(self, fn: Any) -> bool:
        try:
            return self.provenance is None or self.provenance.foreign(fn)
        except Exception:
            return True

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.phase == "harness":
            return
        try:
            if event == "open" and len(args) >= 2 and isinstance(args[1], str) and any(m in args[1] for m in _WRITE_MODES):
                self._check_write(args[0])
            elif event in ("os.remove", "os.rename", "os.rmdir", "shutil.rmtree", "os.truncate"):
                self._check_write(args[0])
            elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn"):
                self._check_process(args, sys._getframe(1))
            elif event in ("os.fork", "os.forkpty", "os.system") and not self._torch_started(sys._getframe(1)):
                self._note("process_escape", f"{event} during {self.phase}")
            elif event == "socket.connect":
                self._note("process_escape", f"network connection to {args[1]!r} during {self.phase}")
        except Exception:  # an audit hook must never break the candidate's own call
            pass

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
        if self._torch_started(frame):  # Inductor's compile workers and probes, at any call (a recompile)
            return
        self._note("process_escape", f"started process {' '.join(words)[:200] or path!r} during {self.phase}")

    def _torch_started(self, frame: Any) -> bool:
        try:
            return self.provenance is not None and self.provenance.torch_started(frame)
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
    def tampered(self) -> list[str]:
        out = []
        for name, getter in self._getters.items():
            now = _safe(getter)
            if now is not self._snapshot.get(name) or getattr(now, "__code__", None) is not self._codes.get(name):
                out.append(name)
        return out

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
    """A built extension whose functions count their calls (launches of the candidate's own code)."""

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
            t0 = time.perf_counter()
            result = attr(*args, **kwargs)  # a call that raises is not a launch
            guards.count(label)
            guards.add_time(label, time.perf_counter() - t0)
            return result

        return counted

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._module, name, value)

    def __dir__(self) -> list[str]:
        return dir(self._module)


def _safe(getter: Callable[[], Any]) -> Any:
    try:
        return getter()
    except Exception:
        return None
