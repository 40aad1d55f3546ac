"""Provenance: whose thread or process it is, by the code that started it and the code it runs.
Torch's own frames are simulated with code compiled under a file name in torch's package directory."""

from __future__ import annotations

import functools
import json
import operator
import os
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

from kbv.sandbox.guards import Provenance


@pytest.fixture(scope="module")
def provenance() -> Provenance:
    import torch

    return Provenance(os.path.dirname(torch.__file__))


def _defined_in(filename: str, source: str, name: str) -> Any:
    """The function `name` of `source`, compiled as if from `filename`."""
    namespace: dict[str, Any] = {"sys": sys, "threading": threading}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


def _torch_file(provenance: Provenance) -> str:
    return os.path.join(provenance.torch, "_inductor", "kbv_test_only.py")  # never written: a name only


def _stdlib_file() -> str:
    return os.path.join(os.path.dirname(threading.__file__), "kbv_test_only.py")


def _library_file(provenance: Provenance) -> str:
    return os.path.join(provenance.libraries[0], "tqdm", "kbv_test_only.py")


def test_files_are_torchs_the_standard_librarys_a_librarys_or_others(provenance: Provenance) -> None:
    import numpy
    import torch.nn.functional

    import kbv.sandbox.child

    assert provenance.origin(torch.nn.functional.__file__) == "torch"
    assert provenance.origin(threading.__file__) == "stdlib"
    assert provenance.origin("<frozen importlib._bootstrap>") == "stdlib"
    assert provenance.origin(numpy.__file__) == "library"
    assert provenance.origin(__file__) == "other"
    assert provenance.origin(kbv.sandbox.child.__file__) == "other"  # the harness, wherever it is installed
    assert provenance.origin("<string>") == "other"  # code the candidate exec'd
    assert provenance.origin("/tmp/kbv_test_only/site-packages/x.py") == "other"  # a library by name only


def test_a_stack_whose_innermost_frame_past_the_standard_library_is_torchs_is_torchs(provenance: Provenance) -> None:
    grab = _defined_in(_stdlib_file(), "def grab():\n    return sys._getframe()\n", "grab")  # like threading's start
    via_torch = _defined_in(_torch_file(provenance), "def via_torch(grab):\n    return grab()\n", "via_torch")
    assert provenance.torch_started(via_torch(grab))  # Inductor's pool starting its worker
    assert not provenance.torch_started(grab())  # the candidate calling threading itself
    assert not provenance.torch_started(sys._getframe())


def test_a_library_torch_calls_starts_torchs_threads_and_one_the_candidate_calls_its_own(
        provenance: Provenance) -> None:
    grab = _defined_in(_stdlib_file(), "def grab():\n    return sys._getframe()\n", "grab")
    library = _defined_in(_library_file(provenance), "def monitor(grab):\n    return grab()\n", "monitor")
    via_torch = _defined_in(_torch_file(provenance), "def via_torch(f, g):\n    return f(g)\n", "via_torch")
    assert provenance.torch_started(via_torch(library, grab))  # tqdm's monitor under max-autotune
    assert not provenance.torch_started(library(grab))


def test_the_guards_own_wrappers_are_passed_over(provenance: Provenance) -> None:
    from kbv.sandbox import guards

    wrapper = _defined_in(guards.__file__, "def wrapper(grab):\n    return grab()\n", "wrapper")
    grab = _defined_in(_stdlib_file(), "def grab():\n    return sys._getframe()\n", "grab")
    via_torch = _defined_in(_torch_file(provenance), "def via_torch(f, g):\n    return f(g)\n", "via_torch")
    assert provenance.torch_started(via_torch(wrapper, grab))
    assert not provenance.torch_started(wrapper(grab))


def test_code_a_thread_runs_is_foreign_unless_torchs_or_the_standard_librarys(provenance: Provenance) -> None:
    import torch

    def mine() -> None:
        pass

    class Task:
        def __call__(self) -> None:
            pass

        def method(self) -> None:
            pass

    assert provenance.foreign(mine) and provenance.foreign(lambda: None)
    assert provenance.foreign(functools.partial(functools.partial(mine)))
    assert provenance.foreign(Task()) and provenance.foreign(Task().method) and provenance.foreign(Task)
    assert provenance.foreign(_defined_in("<string>", "def f():\n    pass\n", "f"))
    assert not provenance.foreign(torch.nn.functional.relu)
    assert not provenance.foreign(torch.relu)  # a builtin of torch's
    assert not provenance.foreign(functools.partial(torch.nn.functional.relu, torch.zeros(1)))
    assert not provenance.foreign(threading.Thread.run)
    assert not provenance.foreign(print)
    assert not provenance.foreign(_defined_in(_library_file(provenance), "def f():\n    pass\n", "f"))


def test_a_thread_is_torchs_only_if_torch_starts_it_and_it_runs_no_foreign_code(provenance: Provenance) -> None:
    grab = _defined_in(_stdlib_file(), "def grab():\n    return sys._getframe()\n", "grab")
    via_torch = _defined_in(_torch_file(provenance), "def via_torch(grab):\n    return grab()\n", "via_torch")
    compiling = _compiling(provenance, via_torch)
    torch_target = _defined_in(_torch_file(provenance), "def work():\n    pass\n", "work")

    class Named(threading.Thread):  # named like Inductor's, run of the candidate's own
        def run(self) -> None:
            pass

    assert provenance.torch_thread(threading.Thread(target=torch_target), compiling(grab))
    assert provenance.torch_thread(threading.Thread(), compiling(grab))
    assert not provenance.torch_thread(threading.Thread(target=lambda: None), compiling(grab))  # laundered
    assert not provenance.torch_thread(threading.Thread(target=operator.call, args=(lambda: None,)), compiling(grab))
    assert not provenance.torch_thread(Named(name="InductorSubproc"), compiling(grab))
    assert not provenance.torch_thread(threading.Thread(target=torch_target, name="InductorSubproc"), grab())
    assert not provenance.torch_thread(threading.Thread(target=torch_target), via_torch(grab))  # a helper called


def _compiling(provenance: Provenance, via_torch: Any) -> Any:
    """`via_torch` called from a frame of Dynamo's: torch's compile machinery asking."""
    dynamo = os.path.join(provenance.torch, "_dynamo", "kbv_test_only.py")  # a name only
    return functools.partial(_defined_in(dynamo, "def compiling(f, g):\n    return f(g)\n", "compiling"), via_torch)


def test_only_torchs_compile_machinery_hands_work_to_torchs_threads(provenance: Provenance) -> None:
    """A torch helper the candidate calls itself (`AsyncCompile.submit`) is the starting frame and
    nothing beyond it is Inductor's or Dynamo's: whatever it hands over is the candidate's."""
    grab = _defined_in(_stdlib_file(), "def grab():\n    return sys._getframe()\n", "grab")
    via_torch = _defined_in(_torch_file(provenance), "def via_torch(grab):\n    return grab()\n", "via_torch")
    helper = _defined_in(os.path.join(provenance.torch, "utils", "kbv_test_only.py"),
                         "def helper(f, g):\n    return f(g)\n", "helper")
    candidate = _defined_in("<string>", "def candidate(f, *a):\n    return f(*a)\n", "candidate")
    compiling = _compiling(provenance, via_torch)
    assert provenance.compile_started(compiling(grab))  # Inductor's pool under Dynamo
    assert not provenance.compile_started(via_torch(grab))  # AsyncCompile.submit called by the candidate
    assert not provenance.compile_started(helper(via_torch, grab))  # through a torch helper that is no compiler
    assert not provenance.compile_started(compiling(functools.partial(candidate, grab)))  # the candidate's frame between
    assert provenance.torch_started(via_torch(grab))
    assert provenance.torch_task(len, (), {}, compiling(grab))
    assert not provenance.torch_task(len, (), {}, via_torch(grab))
    # Inductor's generated module (in a cache the candidate can write) calls AsyncCompile.triton, which
    # calls its worker pool's submit, torch's own: that submit is the starting frame
    generated = _defined_in("/tmp/torchinductor_kbv/ab/cab.py", "def module(f, g):\n    return f(g)\n", "module")
    assert provenance.torch_task(len, (), {}, generated(via_torch, grab), entered=True)
    assert not provenance.torch_task(len, (), {}, generated(via_torch, grab))
    assert not provenance.torch_task(len, (), {}, candidate(grab), entered=True)  # the candidate calls submit


def test_a_partial_or_a_ctypes_callback_runs_the_code_it_holds(provenance: Provenance) -> None:
    import ctypes

    def mine() -> None:
        pass

    assert provenance.foreign(functools.partial(operator.call, mine))
    assert provenance.foreign(functools.partial(operator.call, f=mine))
    assert provenance.foreign(ctypes.CFUNCTYPE(None)(mine))
    assert not provenance.foreign(functools.partial(operator.call, print))
    assert provenance.hands_over_foreign(operator.call, (mine,))
    assert not provenance.hands_over_foreign(operator.call, (print, weakref.ref(provenance)))  # a pool worker's weakref
    import contextvars

    # Inductor's precompile pool runs its work in a copied context
    assert not provenance.foreign(functools.partial(contextvars.copy_context().run, _torch_function(provenance)))
    assert provenance.foreign(functools.partial(contextvars.copy_context().run, mine))


def _torch_function(provenance: Provenance) -> Any:
    return _defined_in(_torch_file(provenance), "def work():\n    pass\n", "work")


def test_the_user_site_and_the_childs_own_directories_are_no_library(provenance: Provenance, tmp_path: Path) -> None:
    import site

    import numpy

    user = os.path.join(site.getusersitepackages(), "kbv_test_only.py")  # the child's HOME is its work directory
    assert provenance.origin(user) == "other"
    planted = Provenance(provenance.torch, writable=[os.path.dirname(os.path.dirname(numpy.__file__))])
    assert planted.origin(numpy.__file__) == "other"  # a library under a directory the child may write
    assert planted.origin(os.path.join(provenance.torch, "x.py")) == "torch"


def test_code_compiled_under_a_library_file_name_is_forged_unless_it_is_that_file(provenance: Provenance) -> None:
    import torch._inductor.codecache as codecache

    real = Provenance(provenance.torch)
    importer = _defined_in("<frozen importlib._bootstrap_external>", "def f():\n    return sys._getframe()\n", "f")()
    candidate = _defined_in("<string>", "def f():\n    return sys._getframe()\n", "f")()
    torch_frame = _defined_in(_torch_file(provenance), "def f():\n    return sys._getframe()\n", "f")()
    with open(codecache.__file__, "rb") as f:
        real.note_compiled(f.read(), codecache.__file__, importer)  # torch's lazy import of a module without bytecode
    real.note_compiled("x = 1\n", f"{codecache.__file__}:codegen(x)", torch_frame)  # torch's own code generator
    assert real.origin(codecache.__file__) == "torch" and not real.forged
    real.note_compiled("x = 1\n", threading.__file__, candidate)
    real.note_compiled(b"x = 1\n", _torch_file(provenance), candidate)  # no such file
    real.note_compiled("x = 1\n", os.path.join(provenance.torch, "nn", "functional.py"), torch_frame)  # a real file
    real.note_compiled("x = 1\n", "<string>", candidate)
    assert real.origin(threading.__file__) == "other" and real.origin(_torch_file(provenance)) == "other"
    assert real.forged == {threading.__file__, _torch_file(provenance), os.path.join(provenance.torch, "nn", "functional.py")}


def test_code_the_candidates_frame_makes_under_a_library_name_is_forged(provenance: Provenance) -> None:
    import torch.nn.functional

    made = Provenance(provenance.torch)
    candidate_frame = _defined_in("<string>", "def f():\n    return sys._getframe()\n", "f")()
    torch_frame = _defined_in(_torch_file(provenance), "def f():\n    return sys._getframe()\n", "f")()
    made.note_made(torch.nn.functional.__file__, torch_frame)  # Dynamo's code transformations
    made.note_made("<string>", candidate_frame)
    assert not made.forged
    made.note_made(torch.nn.functional.__file__, candidate_frame)
    assert made.origin(torch.nn.functional.__file__) == "other"


def test_a_process_is_torchs_by_its_command_line(provenance: Provenance) -> None:
    worker = os.path.join(provenance.torch, "_inductor", "compile_worker", "__main__.py")
    python = sys.executable
    assert provenance.torch_command([python, worker, "--pickler=x.Y", "--kind=fork", "--workers=2", "--parent=1"])
    assert not provenance.torch_command([python, worker, "-c", "import os"])
    assert not provenance.torch_command([python, "-c", "import os; os.system('sh')"])
    assert not provenance.torch_command(["/bin/sh", "-c", "true"])  # torch.utils.collect_env.run
    assert provenance.torch_command(["openssl", "sha512", "/tmp/header.i"])
    assert not provenance.torch_command(["openssl", "s_client", "-connect", "example.com:443"])
    head, tail = _isa_probe_source(provenance).split("__lib_path__")
    assert provenance.torch_command([python, "-c", f"{head}/tmp/torchinductor/a.so{tail}"])
    assert not provenance.torch_command([python, "-c", f'{head}/tmp/a.so"); import os; os.system("sh{tail}'])
    assert not provenance.torch_command(["/usr/bin/env", "-c", f"{head}/tmp/a.so{tail}"])


def _isa_probe_source(provenance: Provenance) -> str:
    from torch._inductor.cpu_vec_isa import VecISA

    return str(VecISA._avx_py_load)


# -- the guards installed, end to end: each scenario is the candidate's code run during a call (after
# the first: nothing is compiling), in one child-like process of its own ------------------------------
_RUNNER = """
import json, sys
from kbv.sandbox.child import Child
from kbv.sandbox.guards import Guards

guards = Guards([sys.argv[1]])
guards.install(Child)
guards.compiling = False
results = {}
for name, source in json.loads(sys.stdin.read()).items():
    guards.events.clear()
    guards.phase = "call"
    scope = {}
    try:
        exec(compile(source, "<candidate " + name + ">", "exec"), scope)
        error = None
    except Exception as exc:
        error = repr(exc)
    guards.phase = "harness"
    results[name] = {"events": list(guards.events), "tampered": guards.tampered(), "error": error,
                     "torch_threads": len(guards.torch_threads),
                     "origins": {p: guards.provenance.origin(p) for p in scope.get("paths", [])}}
    scope.get("undo", lambda: None)()
print("KBV-RESULTS " + json.dumps(results))
"""

_POOL = """
import functools, operator
from torch._inductor import config
from torch._inductor.async_compile import AsyncCompile
config.compile_threads = 2  # a pool even on one core
def work():
    pass
"""
_FORGED = """
import os, threading, torch
def dynamo(name):
    return os.path.join(os.path.dirname(torch.__file__), "_dynamo", name)
SOURCE = "import threading\\ndef start():\\n    threading.Thread(target=len, args=('',)).start()\\n" \\
         "def compiling():\\n    start()\\n"
"""
SCENARIOS = {
    # A: laundering through Inductor's pool, AsyncCompile called by the candidate itself
    "pool_partial": _POOL + "AsyncCompile.submit(functools.partial(operator.call, work)).result()\n",
    "pool_map": _POOL + "AsyncCompile.pool().submit(list, map(work, [])).result()\n",
    "pool_ctypes": _POOL + "import ctypes\nAsyncCompile.submit(ctypes.CFUNCTYPE(None)(work)).result()\n",
    # ... and through its compile-worker process, which runs what it is handed in another process
    "worker_pool": _POOL + "AsyncCompile.process_pool().submit(functools.partial(exec, 'x = 1')).result(timeout=120)\n",
    # B: code compiled or made under a file name of torch's Dynamo
    "forged_source": _FORGED + "ns = {}\nexec(compile(SOURCE, dynamo('kbv_forged_a.py'), 'exec'), ns)\n"
                               "ns['compiling']()\npaths = [dynamo('kbv_forged_a.py')]\n",
    "forged_ast": _FORGED + "import ast\nns = {}\nexec(compile(ast.parse(SOURCE), dynamo('kbv_forged_b.py'), 'exec'), ns)\n"
                            "ns['compiling']()\npaths = [dynamo('kbv_forged_b.py')]\n",
    "forged_replace": _FORGED + textwrap.dedent("""
        def start():
            threading.Thread(target=len, args=('',)).start()
        def compiling():
            start()
        for f in (start, compiling):
            f.__code__ = f.__code__.replace(co_filename=dynamo('kbv_forged_c.py'))
        compiling()
        """),
    "lazy_import": textwrap.dedent("""
        import importlib.machinery, os, torch
        path = os.path.join(os.path.dirname(torch.__file__), "_inductor", "codecache.py")
        loader = importlib.machinery.SourceFileLoader("kbv_lazy", path)
        loader.source_to_code(loader.get_data(path), path)  # what an import without bytecode does
        paths = [path]
        """),
    # C: processes torch's helpers start
    "collect_env": "import torch.utils.collect_env as ce\nce.run('true')\n",
    "isa_probe": "from torch._inductor.cpu_vec_isa import VecAVX2\nVecAVX2()._probe_load('/nonexistent/kbv.so')\n",
    "torch_fork": "import torch.multiprocessing as mp\ndef work(i):\n    pass\n"
                  "mp.start_processes(work, nprocs=1, start_method='fork')\n",
    # F: harness code the old hand-picked table left out
    "patch_helper": "import kbv.sandbox.integrity as ig\noriginal = ig.model_tensors\n"
                    "ig.model_tensors = lambda m: original(m)\ndef undo():\n    ig.model_tensors = original\n",
    "patch_child": "from kbv.sandbox.child import Child\noriginal = Child._deliver\nChild._deliver = lambda *a: original(*a)\n"
                   "def undo():\n    Child._deliver = original\n",
    "patch_timer_body": "from kbv.sandbox.timers import Clock\ncode = Clock.sync.__code__\n"
                        "Clock.sync.__code__ = (lambda self: None).__code__\ndef undo():\n    Clock.sync.__code__ = code\n",
}


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("guards-home")
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(home), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", _RUNNER, str(home)], input=json.dumps(SCENARIOS), env=env,
                          capture_output=True, text=True, timeout=300)
    line = [x for x in done.stdout.splitlines() if x.startswith("KBV-RESULTS ")]
    assert line, done.stderr[-3000:]
    return json.loads(line[-1].removeprefix("KBV-RESULTS "))


def _events(result: dict[str, Any], category: str) -> list[str]:
    return [evidence for cat, evidence in result["events"] if cat == category]


@pytest.mark.parametrize("name", ["pool_partial", "pool_map", "pool_ctypes"])
def test_work_handed_to_inductors_pool_by_the_candidate_is_thread_injection(name: str, scenarios: dict[str, Any]) -> None:
    """A builtin, `list` over a `map`, a ctypes callback: whatever the candidate hands Inductor's pool
    itself runs its code on a thread torch started, and that thread is no longer torch's."""
    result = scenarios[name]
    assert result["error"] is None, result["error"]
    task = {"pool_partial": "'call'", "pool_map": "'list'", "pool_ctypes": "'CFunctionType'"}[name]
    assert any(task in e and "handed to a ThreadPoolExecutor" in e for e in _events(result, "thread_injection")), result
    assert result["torch_threads"] == 0  # not subtracted from the thread counts


def test_work_handed_to_inductors_worker_process_by_the_candidate_is_thread_injection(scenarios: dict[str, Any]) -> None:
    result = scenarios["worker_pool"]
    assert result["error"] is None, result["error"]
    assert any("'exec' handed to a SubprocPool" in e for e in _events(result, "thread_injection")), result
    assert not _events(result, "process_escape")  # the worker itself is Inductor's


@pytest.mark.parametrize("name", ["forged_source", "forged_ast", "forged_replace"])
def test_a_thread_started_by_code_under_a_forged_torch_file_name_is_the_candidates(
        name: str, scenarios: dict[str, Any]) -> None:
    result = scenarios[name]
    assert result["error"] is None, result["error"]
    assert _events(result, "thread_injection"), result
    assert all(origin == "other" for origin in result["origins"].values())


def test_torchs_own_file_compiled_during_a_call_stays_torchs(scenarios: dict[str, Any]) -> None:
    result = scenarios["lazy_import"]
    assert result["error"] is None and list(result["origins"].values()) == ["torch"], result


def test_a_process_a_torch_helper_starts_on_any_command_line_is_an_escape(scenarios: dict[str, Any]) -> None:
    assert any("/bin/sh -c true" in e for e in _events(scenarios["collect_env"], "process_escape")), scenarios["collect_env"]
    assert any("os.fork" in e for e in _events(scenarios["torch_fork"], "process_escape")), scenarios["torch_fork"]


def test_inductors_isa_probe_stays_torchs(scenarios: dict[str, Any]) -> None:
    result = scenarios["isa_probe"]
    assert result["error"] is None and not result["events"], result


@pytest.mark.parametrize(("name", "tampered", "timer"), [
    ("patch_helper", "kbv.sandbox.integrity.model_tensors", False),
    ("patch_child", "Child._deliver", False),
    ("patch_timer_body", "kbv.sandbox.timers.Clock.sync", True),
])
def test_every_harness_function_is_in_the_tamper_table(name: str, tampered: str, timer: bool,
                                                       scenarios: dict[str, Any]) -> None:
    from kbv.sandbox.guards import is_timer

    result = scenarios[name]
    assert result["error"] is None and result["tampered"] == [tampered], result
    assert is_timer(tampered) is timer


def test_a_mode_left_entered_is_named_and_torchs_default_device_is_not() -> None:
    """A TorchDispatchMode or TorchFunctionMode the candidate enters and never leaves runs its code on
    every tensor operation after its call, the harness's copies too: the guards name it (a tampered
    name, `harness_patch`). `torch.set_default_device` pushes torch's own DeviceContext, which only
    places new tensors: not named."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from kbv.detect.evidence import guard_evidence
    from kbv.sandbox.guards import Guards

    class Fill(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    guards = Guards([])
    assert guards.modes() == []
    torch.set_default_device("cpu")
    try:
        assert guards.modes() == [] and guards.tampered() == []
    finally:
        torch.set_default_device(None)
    from torch.utils._device import DeviceContext

    original = DeviceContext.__torch_function__
    torch.set_default_device("cpu")
    DeviceContext.__torch_function__ = lambda self, func, types, args=(), kwargs=None: original(
        self, func, types, args, kwargs)  # torch's mode with the candidate's code in it
    try:
        assert guards.modes() == ["DeviceContext"]
    finally:
        DeviceContext.__torch_function__ = original
        torch.set_default_device(None)
    fill, watch = Fill(), Watch()
    fill.__enter__()
    watch.__enter__()
    try:
        assert sorted(guards.modes()) == ["Fill", "Watch"]
        found = guard_evidence({"guards": {"events": [], "tampered": guards.tampered()}})
    finally:
        watch.__exit__(None, None, None)
        fill.__exit__(None, None, None)
    assert set(found) == {"harness_patch"} and "Fill" in found["harness_patch"] and "Watch" in found["harness_patch"]
    assert guards.modes() == []


def test_an_aten_operator_given_a_kernel_of_the_candidates_is_named_and_torchs_own_are_not() -> None:
    """A kernel registered for an aten operator from outside torch (`torch.library`'s
    Library("aten", "IMPL")) runs on every call of it, the harness's own copies too: the guards name
    the operator (`harness_patch`). A Library of the candidate's own namespace changes no aten
    operator; once the registration is gone, nothing is named."""
    import torch

    from kbv.detect.evidence import guard_evidence
    from kbv.sandbox.guards import Guards

    guards = Guards([])
    assert guards.operators() == []
    own = torch.library.Library("kbv_test_own", "DEF")
    own.define("twice(Tensor x) -> Tensor")
    own.impl("twice", lambda x: x * 2, "CPU")
    aten = torch.library.Library("aten", "IMPL")
    aten.impl("sinc", lambda x: torch.zeros_like(x), "CPU")
    try:
        assert guards.operators() == ["aten::sinc"]
        found = guard_evidence({"guards": {"events": [], "tampered": guards.tampered(operators=True)}})
        assert set(found) == {"harness_patch"} and "aten::sinc" in found["harness_patch"], found
        assert guards.tampered() == []  # only asked for after a checked call: not inside timing
    finally:
        aten._destroy()
        own._destroy()
    assert guards.operators() == []
