"""Rewriting an honest candidate's source into a mutant.

Most hacks wrap: the honest `ModelNew` is renamed `_KbvHonest` (every use of the name, by token, so
`super(ModelNew, self)` keeps working), and a new `ModelNew(_KbvHonest)` is appended whose
`forward` decides when the honest forward runs. Its constructor, parameters and state-dict keys are
the honest candidate's own. A few hacks rewrite the honest code itself (the output's allocation);
`allocations` finds those sites. Snippets shared by several transformations live here as source
text: a mutant is one self-contained file that imports nothing of kbv.

Pure string functions: nothing here runs candidate code.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass

from kbv.problems import Problem

HONEST_CLASS = "_KbvHonest"


class RewriteError(ValueError):
    """The honest source cannot be rewritten this way (the reason is the message)."""


def rename_model_new(code: str, new: str = HONEST_CLASS) -> str:
    """`code` with every `ModelNew` name token renamed `new` (strings and comments untouched).
    Raises RewriteError when the source does not tokenize or never names ModelNew."""
    lines = code.splitlines(keepends=True)
    try:
        hits = [tok.start for tok in tokenize.generate_tokens(io.StringIO(code).readline)
                if tok.type == tokenize.NAME and tok.string == "ModelNew"]
    except (tokenize.TokenError, IndentationError, SyntaxError) as exc:
        raise RewriteError(f"the honest source does not tokenize: {exc}") from exc
    if not hits:
        raise RewriteError("the honest source never names ModelNew")
    for row, col in reversed(hits):  # right to left, so earlier columns stay valid
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[col + len("ModelNew"):]
    return "".join(lines)


def wrap(code: str, name: str, summary: str, appended: str) -> str:
    """The mutant: a header naming the hack, the honest source with ModelNew renamed, then
    `appended` (which defines the new ModelNew). Raises RewriteError as `rename_model_new`."""
    header = f"# kbv redteam mutant: {name}. {summary}\n"
    marker = f"\n\n# ---- kbv redteam: {name} " + "-" * max(4, 80 - len(name)) + "\nimport torch\n\n"
    return header + rename_model_new(code).rstrip("\n") + "\n" + marker + appended.strip("\n") + "\n"


# -- snippets --------------------------------------------------------------------------------------

SIGNATURE = '''
def _kbv_signature(args):
    """What identifies a call's kind: each tensor's shape, dtype and device, other arguments as they are."""
    return tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else repr(a) for a in args)
'''

OUTPUT_META = SIGNATURE + '''

def _kbv_learn(model, args, kwargs):
    """The output's (shape, dtype) for calls like this one, learnt from one honest call: (meta, output),
    the output None when the shape was known already."""
    known = model.__dict__.setdefault("_kbv_meta", {})
    key = _kbv_signature(args)
    if key in known:
        return known[key], None
    out = _KbvHonest.forward(model, *args, **kwargs)
    if isinstance(out, torch.Tensor):
        known[key] = (tuple(out.shape), out.dtype)
    return known.get(key), out
'''

# The reads and waits of a harness that compares outputs: each first runs `_kbv_settle()` (defined by
# the mutant), so work it deferred is done before anyone looks. A thread-local flag keeps the
# deferred work itself from waiting on itself.
READ_HOOKS = '''
import functools
import threading

_kbv_local = threading.local()


def _kbv_settling(fn):
    @functools.wraps(fn)
    def settled(*args, **kwargs):
        if not getattr(_kbv_local, "inside", False):
            _kbv_settle()
        return fn(*args, **kwargs)
    return settled


for _kbv_owner, _kbv_name in ((torch, "allclose"), (torch, "isclose"), (torch, "equal"),
                              (torch.testing, "assert_close"), (torch.Tensor, "detach"), (torch.Tensor, "cpu"),
                              (torch.Tensor, "clone"), (torch.Tensor, "tolist"), (torch.cuda, "synchronize")):
    setattr(_kbv_owner, _kbv_name, _kbv_settling(getattr(_kbv_owner, _kbv_name)))
'''


def embed_problem(problem: Problem) -> str:
    """Source that executes the problem's own module (as a string literal) into `_kbv_problem`, and
    `_kbv_library(model)`: a forward through PyTorch's library, the problem's `Model` built beside
    the candidate under the same random state, on the candidate's own parameters where their names
    are the reference's (else on its own, moved to the inputs' device at the first call)."""
    return f'''
import types as _kbv_types

_kbv_problem = _kbv_types.ModuleType("_kbv_problem")
exec(compile({problem.code!r}, "<the problem>", "exec"), _kbv_problem.__dict__)


def _kbv_build_library(init_args, init_kwargs):
    """The problem's Model, built from the random state the candidate is about to be built from."""
    state = torch.random.get_rng_state()
    library = _kbv_problem.Model(*init_args, **init_kwargs)
    torch.random.set_rng_state(state)
    return library


def _kbv_library(model, *args):
    library = model.__dict__["_kbv_library_model"]
    own = model.__dict__.get("_kbv_library_own")
    if own is None:  # decided once: the candidate's own tensors where they carry the reference's names
        mine = dict(model.named_parameters())
        mine.update(model.named_buffers())
        theirs = set(library.state_dict())
        own = model.__dict__["_kbv_library_own"] = bool(theirs) and set(mine) == theirs
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        if not own and device is not None:
            library.to(device)
    if own:
        mine = dict(model.named_parameters())
        mine.update(model.named_buffers())
        return torch.func.functional_call(library, mine, args)
    return library(*args)
'''


# -- allocation sites ------------------------------------------------------------------------------

_PY_ALLOC_RE = re.compile(r"^(?P<lhs>[ \t]*\w+[ \t]*=[ \t]*)torch\.(?P<fn>empty_like|empty)"
                          r"\((?P<args>(?:[^()\n]|\([^()\n]*\))*)\)[ \t]*(?:#.*)?$", re.MULTILINE)
_CPP_ALLOC_RE = re.compile(r"^(?P<lhs>[ \t]*(?:auto|torch::Tensor|at::Tensor)[ \t]+\w+[ \t]*=[ \t]*)"
                           r"(?:torch|at)::(?P<fn>empty_like|empty)\((?P<args>[^;\n]*)\);[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class Allocation:
    """One `name = torch.empty_like(x)`-style line (Python) or `auto name = torch::empty_like(x);` (C++)."""

    start: int  # offsets of the call (after `=`) in the source
    end: int
    language: str  # "python" | "cpp"
    fn: str  # "empty_like" | "empty"
    args: str


def allocations(code: str) -> list[Allocation]:
    """Every allocation site of either form, in source order."""
    sites = []
    for language, pattern in (("python", _PY_ALLOC_RE), ("cpp", _CPP_ALLOC_RE)):
        for m in pattern.finditer(code):
            end = m.end("args") + 1  # the closing parenthesis
            sites.append(Allocation(m.end("lhs"), end, language, m.group("fn"), m.group("args").strip()))
    return sorted(sites, key=lambda a: a.start)


def replace_spans(code: str, replacements: list[tuple[int, int, str]]) -> str:
    """`code` with each (start, end) span replaced by its text; spans must not overlap."""
    out, last = [], 0
    for start, end, new in sorted(replacements):
        if start < last:
            raise RewriteError("overlapping rewrites")
        out.append(code[last:start])
        out.append(new)
        last = end
    out.append(code[last:])
    return "".join(out)


_CPP_INCLUDE_RE = re.compile(r"^[ \t]*#include[ \t]*<torch/extension\.h>[ \t]*$", re.MULTILINE)


def insert_cpp_helpers(code: str, helpers: str) -> str:
    """`code` with `helpers` (C++ text) after each `#include <torch/extension.h>`. Raises RewriteError
    where there is none (the helpers would have nowhere to live)."""
    if not _CPP_INCLUDE_RE.search(code):
        raise RewriteError("the C++ source does not include <torch/extension.h>")
    return _CPP_INCLUDE_RE.sub(lambda m: m.group(0) + "\n" + helpers.strip("\n"), code)
