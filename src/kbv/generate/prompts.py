"""Single-turn prompts: one template per backend, rendered with one problem's source.

A template is `string.Template` text (package data under `templates/`, or a user's file given with
`--prompt-template`). Placeholders:

    $problem_source   the problem module, as loaded, without `# kbv:` directives
    $problem_name     the problem's name, e.g. 19_ReLU

`$$` writes a literal dollar sign. Any other placeholder, or a template without `$problem_source`, is a
UsageError.

The prompt is a function of the template and the problem's source only. Nothing about how kbv checks
a candidate (input distributions, seeds, trials) is an argument here, so nothing of it can leak; the
`# kbv:` directives (harness metadata such as smoke sizes) are removed from the source shown.
"""

from __future__ import annotations

import enum
import hashlib
import io
import re
import string
import tokenize
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kbv.errors import UsageError, did_you_mean
from kbv.problems import Problem

PLACEHOLDERS = ("problem_source", "problem_name")
_DIRECTIVE_RE = re.compile(r"^#\s*kbv:", re.IGNORECASE)


class Backend(str, enum.Enum):
    """What the prompt asks the kernels to be written in (one template each)."""

    CUDA = "cuda"  # inline CUDA through torch.utils.cpp_extension.load_inline
    TRITON = "triton"


@dataclass(frozen=True)
class PromptTemplate:
    text: str
    origin: str  # "builtin:cuda" or the file it was read from

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def builtin_template(backend: Backend) -> PromptTemplate:
    """The template shipped for `backend`."""
    text = (resources.files(__package__) / "templates" / f"{backend.value}.md").read_text(encoding="utf-8")
    return PromptTemplate(text=text, origin=f"builtin:{backend.value}")


def read_template(path: Path) -> PromptTemplate:
    """A user's template file, checked. Raises UsageError when unreadable or malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Cannot read prompt template '{path}': {exc}") from exc
    check_template(text, str(path))
    return PromptTemplate(text=text, origin=str(path))


def load_template(backend: Backend, path: Path | None = None) -> PromptTemplate:
    """`path`'s template when given, else the built-in one for `backend`."""
    return read_template(path) if path is not None else builtin_template(backend)


def check_template(text: str, origin: str) -> None:
    """Raise UsageError for a malformed `$`, an unknown placeholder, or a missing `$problem_source`."""
    names: set[str] = set()
    for match in string.Template.pattern.finditer(text):
        if match.group("invalid") is not None:
            line = text.count("\n", 0, match.start("invalid")) + 1
            raise UsageError(f"Prompt template '{origin}', line {line}: a bare '$' (write '$$' for a dollar sign).")
        name = match.group("named") or match.group("braced")
        if name:
            names.add(name)
    for name in sorted(names - set(PLACEHOLDERS)):
        hint = did_you_mean(f"${name}", [f"${p}" for p in PLACEHOLDERS])
        raise UsageError(f"Prompt template '{origin}': unknown placeholder ${name} "
                         f"(known: {', '.join('$' + p for p in PLACEHOLDERS)}).{hint}")
    if "problem_source" not in names:
        raise UsageError(f"Prompt template '{origin}' never uses $problem_source.")


def render_prompt(template: PromptTemplate, problem: Problem) -> str:
    """The user message asking for `problem`'s ModelNew."""
    source = strip_directives(problem.code).strip("\n")
    return string.Template(template.text).substitute(problem_source=source, problem_name=problem.name)


def prompt_hash(prompt: str) -> str:
    """sha256 of the rendered prompt: equal hashes, equal prompts."""
    return hashlib.sha256(prompt.encode()).hexdigest()


def strip_directives(code: str) -> str:
    """`code` without `# kbv: ...` comments; a line that held only such a comment is dropped."""
    directive_cols = _directive_columns(code)
    if not directive_cols:
        return code
    out = []
    for row, line in enumerate(code.splitlines(keepends=True), start=1):
        col = directive_cols.get(row)
        if col is None:
            out.append(line)
        elif line[:col].strip():
            out.append(line[:col].rstrip() + "\n")
    return "".join(out)


def _directive_columns(code: str) -> dict[int, int]:
    """Row (1-based) -> column where a `# kbv:` comment starts; only real comments, never strings."""
    columns: dict[int, int] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT and _DIRECTIVE_RE.match(tok.string):
                columns[tok.start[0]] = tok.start[1]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return {}  # problems are checked to parse when loaded; show an odd one as it is
    return columns
