"""kbv attacks itself: honest candidates turned into known hacks, evaluated like any candidate.

A **transformation** wraps or rewrites an honest candidate's source into a hack that fools a
KernelBench-style harness, and declares what it breaks:

    Breaks.SPEED   the time is faked: outputs stay right wherever a harness compares them
    Breaks.TRUTH   outputs are wrong on some inputs (or the caller's data is), yet pass a loose check

Each transformation is one module of `kbv.redteam.transforms`, found by listing the package, so a
new one is one new file defining `TRANSFORMATION` (an instance of a `Transformation` subclass):

    class MyHack(Transformation):
        name = "my_hack"                      # the module's own name
        breaks = Breaks.SPEED
        summary = "what the mutant does, in one line"
        backends = frozenset({Backend.TRITON})  # honest backends it applies to (default: all)
        devices = frozenset({"cuda"})           # devices it means anything on (default: cpu and cuda)

        def rewrite(self, target: Target) -> str | NotApplicable:
            return wrap(target.honest.code, self.name, self.summary, WRAPPER)  # kbv.redteam.source

    TRANSFORMATION = MyHack()

where WRAPPER defines `class ModelNew(_KbvHonest)` (the honest class, renamed) with its own forward.

`Transformation.apply(target)` checks the backend and device, calls `rewrite`, and checks that the
mutant is Python that still defines `ModelNew`: a `Mutant`, or `NotApplicable` with the reason.
A `Target` is the honest candidate, its problem, what the problem's own reference does on its own
inputs (`kbv.redteam.probe.ProblemProbe`, measured in the parent: problem code is trusted, candidate
code never runs here), and the device type of the run.

Modules: `source` (rewriting helpers), `probe` (the problem's reference on its own inputs),
`transforms/` (one hack each; `replay` and `precision` hold what several share), `judge` (the
"fooled" rule, pure), `run` (make mutants, evaluate them through `kbv.api` under both protocols,
judge), `hacker` (an optional model that writes the hack), `command` (`kbv redteam`).
"""

from __future__ import annotations

import abc
import ast
import enum
import importlib
import importlib.util
import pkgutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from kbv.candidates import Backend, Candidate
from kbv.errors import UsageError, did_you_mean
from kbv.problems import Problem
from kbv.redteam.probe import ProblemProbe
from kbv.redteam.source import RewriteError

DEVICE_TYPES = frozenset({"cpu", "cuda"})


class Breaks(str, enum.Enum):
    """What a hack breaks: the time (SPEED) or the outputs on some inputs (TRUTH)."""

    SPEED = "speed"
    TRUTH = "truth"


@dataclass(frozen=True)
class Target:
    """What a transformation is applied to."""

    honest: Candidate
    problem: Problem
    probe: ProblemProbe  # the problem's own reference on its own inputs
    device_type: str  # "cpu" or "cuda": the device the mutants will run on


@dataclass(frozen=True)
class Mutant:
    """A hacked candidate: real source, evaluated like any other candidate."""

    transformation: str
    breaks: Breaks
    honest: Candidate
    problem: Problem
    code: str
    summary: str  # what the hack does, one line


@dataclass(frozen=True)
class NotApplicable:
    """Why a transformation made no mutant of a target."""

    transformation: str
    reason: str


@dataclass(frozen=True)
class Failed(NotApplicable):
    """A transformation that raised, or wrote something other than Python defining ModelNew: no
    mutant of this target, said as the run goes, and the run goes on with the other transformations
    (a user's own module under --transform-dir is the user's input, not a fault of kbv)."""


class Transformation(abc.ABC):
    """One known hack, as a rewrite of an honest candidate. Subclasses set the class attributes
    and implement `rewrite`; `apply` is the entry point."""

    name: ClassVar[str]
    breaks: ClassVar[Breaks]
    summary: ClassVar[str]
    backends: ClassVar[frozenset[Backend]] = frozenset(Backend)
    devices: ClassVar[frozenset[str]] = DEVICE_TYPES

    @abc.abstractmethod
    def rewrite(self, target: Target) -> str | NotApplicable:
        """The mutant's source, or why there is none. Pure: reads the target, runs nothing."""

    def apply(self, target: Target) -> Mutant | NotApplicable:
        """A mutant of `target`, or NotApplicable with the reason (backend, device, or the
        transformation's own). A rewrite that raises, or returns anything but Python source defining
        ModelNew, is a bug in the transformation: Failed, with what went wrong."""
        try:
            if target.device_type not in self.devices:
                return self.not_applicable(f"it means nothing on {target.device_type} "
                                           f"(only on {', '.join(sorted(self.devices))})")
            backend = target.honest.backend
            if backend not in self.backends:
                return self.not_applicable(f"{backend.value} candidates are not rewritten by it")
            code = self.rewrite(target)
        except RewriteError as exc:  # the honest source does not lend itself to this rewrite
            return self.not_applicable(str(exc))
        except Exception as exc:  # noqa: BLE001 - any module's bug, a user's own above all, is the module's
            return Failed(self.name, f"the transformation failed: {type(exc).__name__}: {exc}")
        if isinstance(code, NotApplicable):
            return code
        wrong = _source_fault(code)
        if wrong:
            return Failed(self.name, f"the transformation wrote {wrong}")
        return Mutant(self.name, self.breaks, target.honest, target.problem, code, self.summary)

    def not_applicable(self, reason: str) -> NotApplicable:
        return NotApplicable(self.name, reason)


class OutputWrapper(Transformation):
    """A transformation that appends `wrapper` (a ModelNew subclassing the honest one) to the honest
    source, for forwards that return one tensor: the wrapper stands in for that tensor."""

    wrapper: ClassVar[str]

    def rewrite(self, target: Target) -> str | NotApplicable:
        from kbv.redteam.source import wrap

        if target.probe.output_shape is None:
            return self.not_applicable("the forward does not return one tensor")
        return wrap(target.honest.code, self.name, self.summary, self.wrapper)


def _source_fault(code: object) -> str:
    """What is wrong with a rewrite's result as a mutant's source ("" where nothing is)."""
    if not isinstance(code, str):
        return f"a {type(code).__name__}, not a mutant's source"
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return f"a mutant that is not Python: {exc}"
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        return "a mutant without a top-level ModelNew"
    return ""


def discover(extra_dirs: Sequence[str | Path] = ()) -> tuple[Transformation, ...]:
    """Every transformation: the modules of `kbv.redteam.transforms`, then the `*.py` files of each
    directory in `extra_dirs` (a user's own), sorted by name. Each module defines `TRANSFORMATION`.
    Raises UsageError for a module without one, one whose name differs from its module's, a name
    defined twice, or a directory that does not exist."""
    from kbv.redteam import transforms

    found: list[tuple[str, object]] = []
    for info in pkgutil.iter_modules(transforms.__path__):
        module = importlib.import_module(f"{transforms.__name__}.{info.name}")
        found.append((info.name, getattr(module, "TRANSFORMATION", None)))
    for directory in extra_dirs:
        found.extend(_load_dir(Path(directory)))
    return _checked(found)


def _load_dir(directory: Path) -> list[tuple[str, object]]:
    if not directory.is_dir():
        raise UsageError(f"--transform-dir {directory}: no such directory.")
    found = []
    for path in sorted(directory.glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"kbv_user_transform_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise UsageError(f"{path}: cannot be imported as a transformation.")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)  # the user's own code, as trusted as a problem file
        except Exception as exc:
            raise UsageError(f"{path}: importing the transformation raised {type(exc).__name__}: {exc}") from exc
        found.append((path.stem, getattr(module, "TRANSFORMATION", None)))
    return found


def _checked(found: list[tuple[str, object]]) -> tuple[Transformation, ...]:
    by_name: dict[str, Transformation] = {}
    for module, obj in found:
        if not isinstance(obj, Transformation):
            raise UsageError(f"transformation module '{module}' defines no TRANSFORMATION (a Transformation instance).")
        if obj.name != module:
            raise UsageError(f"transformation module '{module}' names its transformation '{obj.name}': "
                             "the two must agree.")
        if obj.name in by_name:
            raise UsageError(f"two transformations are named '{obj.name}'.")
        by_name[obj.name] = obj
    return tuple(by_name[n] for n in sorted(by_name))


def select(available: Sequence[Transformation], names: Sequence[str]) -> tuple[Transformation, ...]:
    """The transformations named (all of them when `names` is empty), in `available`'s order.
    Raises UsageError for an unknown name, with the nearest one."""
    known = {t.name: t for t in available}
    for name in names:
        if name not in known:
            raise UsageError(f"Unknown transformation '{name}'.{did_you_mean(name, list(known))}")
    wanted = set(names)
    return tuple(t for t in available if not wanted or t.name in wanted)
