"""Candidates: modules defining `ModelNew`, and their pairing with problems.

Accepted inputs:
- one `.py` file (pairs with the single problem given, or by its name);
- a directory of candidates named after their problems: `19_ReLU.py`, `19_ReLU__anything.py`,
  `19_ReLU/anything.py`, optionally under `levelN/` folders. KernelBench's own names hold `__`
  (`55_conv_standard_2D__asymmetric_input__square_kernel`) and may end in `_`
  (`12_Matmul_with_diagonal_matrices_`): a name pairs with the longest problem name it begins
  with, followed by a `__` (so `12_Matmul_with_diagonal_matrices___triton` pairs);
- a KernelBench run directory: `level_{L}_problem_{P}_sample_{S}_kernel.py`;
- JSONL: one object a line with `problem` and `code`, optionally `model`, `sample`, `status`.

Candidates that match no problem, or several, are reported in `Pairing.unpaired`, never dropped.
"""

from __future__ import annotations

import ast
import enum
import io
import json
import re
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kbv.errors import CandidateSourceError, close_matches, suggestion
from kbv.problems import Problem, content_hash, resolve_problem

_RUN_FILE_RE = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel$")
_LEVEL_DIR_RE = re.compile(r"^level_?(\d+)$", re.IGNORECASE)


class Backend(str, enum.Enum):
    """How a candidate computes: decides on which devices it can run."""

    CUDA = "cuda"  # load_inline with cuda_sources, or raw CUDA
    TRITON = "triton"
    CPP = "cpp"  # C++ extension without CUDA: CPU only
    TORCH = "torch"  # plain PyTorch

    def runs_on(self, device_type: str) -> bool:
        return self.cannot_run_because(device_type) is None

    def cannot_run_because(self, device_type: str) -> str | None:
        """Why a candidate of this backend cannot run on a device of `device_type`, in a few words
        ("no CUDA device"); None where it can."""
        if self is Backend.CUDA and device_type != "cuda":
            return "no CUDA device"
        if self is Backend.CPP and device_type != "cpu":
            return "a C++ extension without CUDA runs on the CPU only"
        return None


@dataclass(frozen=True)
class Candidate:
    """One candidate module and what it claims to solve."""

    code: str
    name: str  # display name: file stem, or "sample 3 of model X"
    origin: str  # a path, or "FILE.jsonl:LINE"
    problem_ref: str  # what it names: "19_ReLU", "L1/19"
    model: str | None = None
    sample: int | None = None
    no_code: bool = False  # a generated reply without a code block

    @property
    def hash(self) -> str:
        return content_hash(self.code)

    @property
    def backend(self) -> Backend:
        return detect_backend(self.code)


@dataclass(frozen=True)
class Pair:
    problem: Problem
    candidate: Candidate


@dataclass(frozen=True)
class Unpaired:
    candidate: Candidate
    reason: str

    def describe(self) -> str:
        """'FILE: why': the candidate's origin and the reason it did not pair."""
        return f"{self.candidate.origin}: {self.reason}"

    def to_dict(self) -> dict[str, str]:
        return {"candidate": self.candidate.name, "origin": self.candidate.origin,
                "problem_ref": self.candidate.problem_ref, "reason": self.reason}


@dataclass(frozen=True)
class Pairing:
    pairs: tuple[Pair, ...]
    unpaired: tuple[Unpaired, ...]


def unpaired_lines(unpaired: Sequence[Unpaired], limit: int) -> list[str]:
    """One line per unpaired candidate ('FILE: why'), the first `limit` of them, then
    '... and N more' where there are more."""
    lines = [u.describe() for u in unpaired[:limit]]
    if len(unpaired) > limit:
        lines.append(f"... and {len(unpaired) - limit} more")
    return lines


def detect_backend(code: str) -> Backend:
    """Best guess of a candidate's backend from its source."""
    if re.search(r"cuda_sources\s*=|__global__|\.cu['\"]|cpp_extension\.load\(", code):
        return Backend.CUDA
    if re.search(r"@\s*triton\.jit|\bimport\s+triton\b|\bfrom\s+triton\b", code):
        return Backend.TRITON
    # a C++ extension: load_inline, or `load` of sources the candidate writes (imported by name)
    if re.search(r"\bload_inline\s*\(|cpp_sources\s*=|"
                 r"from\s+torch\.utils\.cpp_extension\s+import\b[^\n]*\bload\b", code):
        return Backend.CPP
    return Backend.TORCH


def compiles_when_constructed(code: str) -> bool:
    """Whether a function or method of the source calls `load_inline` or cpp_extension's `load`: a
    candidate that builds its extension in `ModelNew.__init__` (or later) rather than at import, which
    the build phase must construct to build (`kbv.builds`)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name == "load_inline" or (name == "load" and "cpp_extension" in code):
                    return True
    return False


def has_code(code: str) -> bool:
    """False when the source holds nothing but comments and white space."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER,
                                tokenize.INDENT, tokenize.DEDENT):
                return True
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return True  # malformed code is still code: the build reports it
    return False


def load_candidates(path: str | Path, problems: Sequence[Problem]) -> Pairing:
    """Read candidates at `path` and pair each with its problem.

    Raises CandidateSourceError when `path` cannot be read at all.
    """
    path = Path(path)
    if not path.exists():
        raise CandidateSourceError(f"No candidates at '{path}': no such file or directory.")
    if path.is_dir():
        candidates = _read_dir(path)
    elif path.suffix == ".jsonl":
        candidates = _read_jsonl(path)
    elif path.suffix == ".py":
        candidates = [_read_file(path, path.parent)]
        if len(problems) == 1:  # a single file with a single problem pairs whatever its name
            return Pairing((Pair(problems[0], candidates[0]),), ())
    else:
        raise CandidateSourceError(f"Cannot read candidates from '{path}': expected a .py file, a directory or a .jsonl file.")
    if not candidates:
        raise CandidateSourceError(f"No candidate files (*.py) under '{path}'.")
    return pair_candidates(candidates, problems)


def pair_candidates(candidates: Sequence[Candidate], problems: Sequence[Problem]) -> Pairing:
    """Pair by the problem each candidate names; report the rest with a reason."""
    pairs: list[Pair] = []
    unpaired: list[Unpaired] = []
    for cand in candidates:
        matches = _longest_matches(cand.problem_ref, problems)
        if len(matches) == 1:
            pairs.append(Pair(matches[0], cand))
        elif not matches:
            ref = _shortest(cand.problem_ref)
            unpaired.append(Unpaired(cand, f"no problem named '{ref}'.{_hint(cand.problem_ref, ref, problems)}"))
        else:
            keys = ", ".join(p.key for p in matches)
            unpaired.append(Unpaired(cand, f"'{cand.problem_ref}' is ambiguous: {keys}"))
    return Pairing(tuple(pairs), tuple(unpaired))


def _hint(ref: str, short: str, problems: Sequence[Problem]) -> str:
    """' Did you mean ...?' for a reference that names no problem: the names closest to its own (the
    whole of it first: a typo in a long name with __ in it may leave its first part unlike any), each
    problem once, by its name, or by its keys where levels share that name (those of the reference's
    level where it names one)."""
    keys: dict[str, list[str]] = {}
    for p in problems:
        keys.setdefault(p.name, []).append(p.key)
    close = close_matches(_bare(ref), keys) or close_matches(_bare(short), keys)
    level = ref.rpartition("/")[0]
    shown: list[str] = []
    for name in close:
        mine = [k for k in keys[name] if k.startswith(f"{level}/")] if level else []
        shown += [name] if len(keys[name]) == 1 else mine or sorted(keys[name])
    return suggestion(shown)


def _bare(ref: str) -> str:
    return ref.split("/")[-1]


def _prefixes(ref: str) -> list[str]:
    """`ref` and its shorter forms, longest first: its name cut at every position where a `__`
    starts. A label after the problem's name is separated by `__`, and so are words inside
    KernelBench's own names, whose names may end in `_` too: '12_Matmul_x___triton' gives
    '12_Matmul_x___triton', '12_Matmul_x_', '12_Matmul_x', and 'L2/55_a__b__c' gives 'L2/55_a__b__c',
    'L2/55_a__b', 'L2/55_a'. The longest that names a problem wins (`_longest_matches`)."""
    head, sep, name = ref.rpartition("/")
    cuts = [i for i in range(len(name) - 2, 0, -1) if name.startswith("__", i)]
    return [ref] + [head + sep + name[:i] for i in cuts]


def _shortest(ref: str) -> str:
    return _prefixes(ref)[-1]


def _longest_matches(ref: str, problems: Sequence[Problem]) -> list[Problem]:
    """The problems of the longest form of `ref` that names any (see `_prefixes`)."""
    for form in _prefixes(ref):
        matches = _matches(form, problems)
        if matches:
            return matches
    return []


def _matches(ref: str, problems: Sequence[Problem]) -> list[Problem]:
    m = re.match(r"^L(\d+)/P(\d+)$", ref)
    if m:  # a KernelBench run file: level and problem id
        level, pid = int(m.group(1)), int(m.group(2))
        return [p for p in problems if p.level == level and p.problem_id == pid]
    matches = resolve_problem(problems, ref)
    if not matches and "/" not in ref and not ref.isdigit():
        # 'relu' naming '19_ReLU': match on the part after the id
        lowered = ref.lower()
        matches = [p for p in problems if p.name.split("_", 1)[-1].lower() == lowered]
    return matches


def _read_file(path: Path, root: Path) -> Candidate:
    try:
        code = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CandidateSourceError(f"{path}: cannot read: {exc}") from exc
    ref, sample = _ref_from_path(path, root)
    try:
        name = str(path.relative_to(root).with_suffix(""))
    except ValueError:
        name = path.stem
    return Candidate(code=code, name=name or path.stem, origin=str(path), problem_ref=ref,
                     sample=sample, no_code=not has_code(code))


def _ref_from_path(path: Path, root: Path) -> tuple[str, int | None]:
    """What problem a file names, and its sample index, from its path."""
    stem = path.stem
    m = _RUN_FILE_RE.match(stem)
    if m:
        return f"L{int(m.group(1))}/P{int(m.group(2))}", int(m.group(3))
    level = None
    parents = path.relative_to(root).parts[:-1] if path.is_relative_to(root) else ()
    for part in parents:
        lm = _LEVEL_DIR_RE.match(part)
        if lm:
            level = int(lm.group(1))
    ref = stem  # 19_ReLU__label: pairing cuts the label off (`_longest_matches`)
    non_level = [p for p in parents if not _LEVEL_DIR_RE.match(p)]
    if non_level and "__" not in stem:
        ref = non_level[-1]  # 19_ReLU/anything.py
    return (f"L{level}/{ref}" if level is not None else ref), None


def _read_dir(root: Path) -> list[Candidate]:
    files = sorted(p for p in root.rglob("*.py") if not p.name.startswith((".", "__init__")))
    return [_read_file(p, root) for p in files if "__pycache__" not in p.parts]


def _read_jsonl(path: Path) -> list[Candidate]:
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CandidateSourceError(f"{path}: cannot read: {exc}") from exc
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        out.append(_jsonl_record(path, lineno, line))
    return out


def _jsonl_record(path: Path, lineno: int, line: str) -> Candidate:
    where = f"{path}:{lineno}"
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CandidateSourceError(f"{where}: not valid JSON: {exc.msg}") from exc
    if not isinstance(rec, dict) or "problem" not in rec or "code" not in rec:
        raise CandidateSourceError(f"{where}: each line needs 'problem' and 'code'")
    code = rec["code"] if isinstance(rec["code"], str) else ""
    model = rec.get("model")
    sample = rec.get("sample")
    if sample is not None and not isinstance(sample, int):
        raise CandidateSourceError(f"{where}: 'sample' must be an integer")
    name = f"{rec['problem']}"
    if model:
        name += f" [{model}]"
    if sample is not None:
        name += f" #{sample}"
    no_code = rec.get("status") in ("no_code", "request_failed") or not has_code(code)
    return Candidate(code=code, name=name, origin=where, problem_ref=str(rec["problem"]),
                     model=str(model) if model else None, sample=sample, no_code=no_code)
