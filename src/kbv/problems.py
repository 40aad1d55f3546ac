"""Problems: KernelBench-format modules (`Model`, `get_inputs`, `get_init_inputs`).

Sources: one `.py` file, a directory of problems, KernelBench's repository or its problem folder
(problems from its `level1/`..`level4/` folders only, see `_load_dir`), a Parquet
file with KernelBench's Hugging Face columns (`code, level, name, problem_id`), or a bundled suite
(`smoke`, `full`; see `kbv.suite`).

Loading checks the source statically (it compiles, it defines the three names); executing it is
`instantiate_problem`, done by the evaluator.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import re
import types
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kbv.errors import ProblemLoadError, ProblemRunError, UsageError, did_you_mean

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
_FILE_RE = re.compile(r"^(\d+)_(.+)$")
_LEVEL_RE = re.compile(r"^level_?(\d+)$", re.IGNORECASE)


@dataclass(frozen=True)
class Problem:
    """One problem: its source and where it came from."""

    name: str  # "19_ReLU": the file stem, KernelBench's name
    level: int | None
    problem_id: int | None
    code: str
    origin: str  # a path, "parquet:FILE#ROW", or "suite:smoke/level1/19_ReLU.py"
    suite: str | None = None

    @property
    def hash(self) -> str:
        """sha256 of the source with line endings and trailing spaces normalised."""
        return content_hash(self.code)

    @property
    def key(self) -> str:
        """Display and pairing key: 'L1/19_ReLU' (or the bare name without a level)."""
        return f"L{self.level}/{self.name}" if self.level is not None else self.name

    @property
    def order(self) -> tuple[int, int, str]:
        """Where the problem is listed (`problem_order`)."""
        return problem_order(self.level, self.name, self.problem_id)


_NO_ID = 1 << 30  # problems without an id are listed after those with one


def problem_order(level: int | None, name: str, problem_id: int | None = None) -> tuple[int, int, str]:
    """The order problems are listed in, everywhere (loading, evaluation, reports): by level, then
    KernelBench's problem id (by default the name's leading number), then name."""
    if problem_id is None:
        match = _FILE_RE.match(name)
        problem_id = int(match.group(1)) if match else None
    return (level or 0, problem_id if problem_id is not None else _NO_ID, name)


def key_order(key: str) -> tuple[int, int, str]:
    """`problem_order` of a problem key: 'L1/19_ReLU', or a bare name."""
    level, _, name = key.partition("/")
    if name and level[:1] == "L" and level[1:].isdigit():
        return problem_order(int(level[1:]), name)
    return problem_order(None, key)


def content_hash(code: str) -> str:
    """A stable hash of source text (line endings and trailing white space do not count)."""
    lines = [line.rstrip() for line in code.replace("\r\n", "\n").split("\n")]
    return hashlib.sha256("\n".join(lines).strip().encode()).hexdigest()


def load_problems(spec: str | Path) -> list[Problem]:
    """Problems from a suite name, a `.py` file, a directory tree or a `.parquet` file.

    Raises UsageError for a path that does not exist or a directory that holds no problem,
    ProblemLoadError for a malformed problem (or two problems with one key).
    """
    from kbv import suite

    text = str(spec)
    if text in suite.SUITES:
        return load_suite(text)
    path = Path(text)
    if not path.exists():
        hint = did_you_mean(text, suite.SUITES)
        raise UsageError(f"No problems at '{text}': not a file, directory or suite "
                         f"({', '.join(suite.SUITES)}).{hint}")
    if path.is_dir():
        return _load_dir(path)
    if path.suffix == ".parquet":
        return _load_parquet(path)
    if path.suffix == ".py":
        return [load_problem_file(path)]
    raise UsageError(f"Cannot read problems from '{path}': expected a .py file, a directory or a .parquet file.")


def load_suite(name: str) -> list[Problem]:
    """All problems of the bundled suite `name` ('smoke' or 'full'), ordered by level and id."""
    from kbv import suite

    problems = [make_problem(s.stem, s.code, origin=s.origin, level=s.level, suite=name)
                for s in suite.suite_sources(name)]
    return sorted(problems, key=lambda p: p.order)


def load_problem_file(path: Path, level: int | None = None) -> Problem:
    """One problem file; the level comes from a `levelN` parent directory unless given."""
    try:
        code = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemLoadError(f"{path}: cannot read: {exc}") from exc
    if level is None:  # the nearest enclosing levelN folder
        level = next((lv for lv in (_level_of(part) for part in reversed(path.parent.parts)) if lv is not None), None)
    name = path.stem
    return make_problem(name, code, origin=str(path), level=level)


def make_problem(name: str, code: str, origin: str, level: int | None = None,
                 problem_id: int | None = None, suite: str | None = None) -> Problem:
    """Validate the source statically and build the record."""
    check_source(code, origin)
    if problem_id is None:
        match = _FILE_RE.match(name)
        problem_id = int(match.group(1)) if match else None
    return Problem(name=name, level=level, problem_id=problem_id, code=code, origin=origin, suite=suite)


def check_source(code: str, origin: str) -> None:
    """Raise ProblemLoadError unless `code` compiles and defines Model, get_inputs, get_init_inputs."""
    try:
        tree = ast.parse(code, filename=origin)
    except SyntaxError as exc:
        raise ProblemLoadError(f"{origin}: syntax error at line {exc.lineno}: {exc.msg}") from exc
    defined = _top_level_names(tree)
    missing = [n for n in REQUIRED_NAMES if n not in defined]
    if missing:
        raise ProblemLoadError(f"{origin}: not a KernelBench problem: missing {', '.join(missing)}")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _level_of(dirname: str) -> int | None:
    match = _LEVEL_RE.match(dirname)
    return int(match.group(1)) if match else None


LEVEL_SEARCH_DEPTH = 3  # KernelBench's repository holds its level folders at KernelBench/level1
_NOT_SEARCHED = frozenset({"__pycache__", "node_modules", "site-packages", "venv", "env"})


def _load_dir(root: Path) -> list[Problem]:
    """A directory's problems. Where it holds level folders (`level1`, `level_2`, ... up to
    LEVEL_SEARCH_DEPTH down: KernelBench's repository or its problem folder), problems come from
    them alone, so the Python beside them (`src/`, `scripts/`) is never read as a problem; else
    every `.py` file under it is one."""
    levels = level_dirs(root)
    files = _problem_files(levels or [root])
    shown = ", ".join(str(d.relative_to(root)) for d in levels)
    where = f"the level folders of '{root}' ({shown})" if levels else f"'{root}'"
    if not files:
        raise UsageError(f"No problem files (*.py) under {where}.")
    problems, errors = [], []
    for path in files:
        try:
            problems.append(load_problem_file(path))
        except ProblemLoadError as exc:
            errors.append(exc)
    if errors and not problems:  # nothing here is a problem: say so, and why the first file is not
        count = f"{len(files)} .py file{'s' * (len(files) != 1)}"
        raise UsageError(f"No KernelBench problem under {where} ({count}; {errors[0]})") from errors[0]
    if errors:
        raise errors[0]
    _check_unique(problems)
    return sorted(problems, key=lambda p: p.order)


def level_dirs(root: Path, depth: int = LEVEL_SEARCH_DEPTH) -> list[Path]:
    """The level folders at most `depth` below `root` (not `root` itself), in path order; none is
    searched inside, nor are hidden folders, `__pycache__` or virtual environments."""
    found: list[Path] = []
    frontier = [root]
    for _ in range(depth):
        below = [d for parent in frontier for d in _subdirs(parent)]
        found += [d for d in below if _level_of(d.name) is not None]
        frontier = [d for d in below if _level_of(d.name) is None]
    return sorted(found)


def _subdirs(parent: Path) -> list[Path]:
    try:
        entries = sorted(parent.iterdir())
    except OSError:  # unreadable: nothing of it is searched
        return []
    return [d for d in entries if d.is_dir() and not _skipped_dir(d)]


def _skipped_dir(path: Path) -> bool:
    return path.name.startswith(".") or path.name in _NOT_SEARCHED or (path / "pyvenv.cfg").exists()


def _problem_files(dirs: Sequence[Path]) -> list[Path]:
    """The `.py` files under `dirs`, less private ones (`_x.py`) and those in hidden folders or
    `__pycache__`."""
    files = set()
    for top in dirs:
        for path in top.rglob("*.py"):
            inside = path.relative_to(top).parts[:-1]
            if not path.name.startswith(("_", ".")) and not any(p.startswith(".") or p == "__pycache__" for p in inside):
                files.add(path)
    return sorted(files)


def _load_parquet(path: Path) -> list[Problem]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise UsageError("Reading .parquet problems needs pyarrow: pip install 'kernelbench-verified[parquet]'") from exc
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises many types for a bad file
        raise ProblemLoadError(f"{path}: not a readable Parquet file: {exc}") from exc
    missing = {"code", "name"} - set(table.column_names)
    if missing:
        raise ProblemLoadError(f"{path}: missing column(s) {', '.join(sorted(missing))}; "
                               "expected KernelBench's columns code, level, name, problem_id")
    problems = []
    for row, rec in enumerate(table.to_pylist()):
        name = str(rec["name"]).removesuffix(".py")
        level = int(rec["level"]) if rec.get("level") is not None else None
        pid = int(rec["problem_id"]) if rec.get("problem_id") is not None else None
        problems.append(make_problem(name, rec["code"], origin=f"parquet:{path}#{row}", level=level, problem_id=pid))
    _check_unique(problems)
    return sorted(problems, key=lambda p: p.order)


def _check_unique(problems: Sequence[Problem]) -> None:
    seen: dict[str, Problem] = {}
    for p in problems:
        if p.key in seen:
            raise ProblemLoadError(f"Two problems named {p.key}: {seen[p.key].origin} and {p.origin}")
        seen[p.key] = p


def find_problem(problems: Iterable[Problem], ref: str) -> Problem:
    """The problem a user names: 'L1/19_ReLU', 'level1/19_ReLU', '19_ReLU' (if unique) or its key."""
    problems = list(problems)
    matches = resolve_problem(problems, ref)
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"Unknown problem '{ref}'.{did_you_mean(ref, [p.name for p in problems] + [p.key for p in problems])}")
    raise UsageError(f"Problem '{ref}' is ambiguous: {', '.join(p.key for p in matches)}")


def resolve_problem(problems: Sequence[Problem], ref: str, level: int | None = None) -> list[Problem]:
    """All problems `ref` could name (exact key, or name within `level` when given)."""
    ref = ref.strip().removesuffix(".py")
    m = re.match(r"^(?:L|level_?)(\d+)[/:](.+)$", ref, re.IGNORECASE)
    if m:
        level, ref = int(m.group(1)), m.group(2)
    cands = [p for p in problems if level is None or p.level == level]
    exact = [p for p in cands if p.name == ref]
    if exact:
        return exact
    lowered = [p for p in cands if p.name.lower() == ref.lower()]
    if lowered:
        return lowered
    if ref.isdigit():
        return [p for p in cands if p.problem_id == int(ref)]
    return []


@contextlib.contextmanager
def problem_code(origin: str, what: str) -> Iterator[None]:
    """Around a call into a problem's own code (`get_inputs`, `Model(...)`, its forward): what it
    raises becomes a ProblemRunError naming the problem. Only such calls are wrapped, so that a bug
    in kbv is never reported as the problem's own failure."""
    try:
        yield
    except ProblemRunError:
        raise
    except Exception as exc:
        if out_of_memory(exc):  # the device's limit, not the problem's fault: the caller decides
            raise
        raise ProblemRunError(f"{origin}: the problem's own code failed ({what}): {type(exc).__name__}: {exc}") from exc


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is the device running out of memory (PyTorch's allocator or the driver)."""
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).split("\n", 1)[0]


_MODULES: dict[str, types.ModuleType] = {}  # problem hash -> its executed module (the source runs once)


def instantiate_problem(problem: Problem) -> types.ModuleType:
    """The problem's module, executed once per process (later calls return the same module).
    Raises ProblemRunError naming the origin."""
    key = f"{problem.hash}:{problem.origin}"
    if key not in _MODULES:
        if len(_MODULES) >= 8:
            _MODULES.pop(next(iter(_MODULES)))
        _MODULES[key] = _execute(problem)
    return _MODULES[key]


def _execute(problem: Problem) -> types.ModuleType:
    module = types.ModuleType(f"kbv_problem_{problem.hash[:12]}")
    module.__file__ = problem.origin
    try:
        code = compile(problem.code, problem.origin, "exec")
        exec(code, module.__dict__)  # problems are trusted benchmark code, not candidates
    except Exception as exc:
        raise ProblemRunError(f"{problem.origin}: executing the problem raised {type(exc).__name__}: {exc}") from exc
    for name in REQUIRED_NAMES:
        if not callable(getattr(module, name, None)):
            raise ProblemLoadError(f"{problem.origin}: {name} is not callable")
    return module
