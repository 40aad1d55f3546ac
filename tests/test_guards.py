"""Provenance: whose thread or process it is, by the code that started it and the code it runs.
Torch's own frames are simulated with code compiled under a file name in torch's package directory."""

from __future__ import annotations

import functools
import os
import sys
import threading
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
    torch_target = _defined_in(_torch_file(provenance), "def work():\n    pass\n", "work")

    class Named(threading.Thread):  # named like Inductor's, run of the candidate's own
        def run(self) -> None:
            pass

    assert provenance.torch_thread(threading.Thread(target=torch_target), via_torch(grab))
    assert provenance.torch_thread(threading.Thread(), via_torch(grab))
    assert not provenance.torch_thread(threading.Thread(target=lambda: None), via_torch(grab))  # laundered
    assert not provenance.torch_thread(Named(name="InductorSubproc"), via_torch(grab))
    assert not provenance.torch_thread(threading.Thread(target=torch_target, name="InductorSubproc"), grab())
