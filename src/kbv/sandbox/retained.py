"""Retained state: the tensors a candidate holds after its import and construction, beyond its model's
parameters and buffers (precomputed answers, tables, caches of inputs).

Child-side: `find_retained` runs in the candidate's process, right after the model is built. It looks
in two places and counts each storage once:

- what the candidate can name: the candidate module's globals (into its own classes and its
  functions' closures and defaults) and the model's attributes, recursively through dicts, lists,
  tuples, sets and objects' `__dict__`, to a bounded depth and number of objects, reported by path,
  e.g. `kbv_candidate.ANSWERS: 69 tensors (cpu, 17.2 MiB)`;
- every other tensor alive in the process, through the garbage collector (`gc: 3 tensors (...)`):
  what closures, `lru_cache`s, C++ objects' Python owners or deleted globals still hold.

The model's parameters and buffers (counted apart, as `weights_bytes`) and the harness's own tensors
(the `harness` roots: kept inputs, the timing pool, the L2 flush buffer) are left out, by storage. A
view counts its whole storage: it keeps all of it alive. Memory outside PyTorch tensors (raw
`cudaMalloc`, C++ statics, numpy arrays) is not seen here; the device-level memory figure is where
that shows. The figures are evidence the candidate can tamper with in its own process, not proof that
nothing was held.
"""

from __future__ import annotations

import gc
import types
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import torch

MAX_DEPTH = 8
MAX_OBJECTS = 50_000  # objects visited from the named roots
MAX_WHERE = 8  # entries of `where`
_KEY_CHARS = 40


def find_retained(module: types.ModuleType | None, model: Any, harness: Iterable[Any] = ()) -> dict[str, Any]:
    """{"bytes": int, "where": [str, ...], "weights_bytes": int}: the bytes of every tensor storage alive
    beyond `model`'s parameters and buffers and the `harness` objects' tensors, where they were found
    (largest first), and the bytes of the parameters and buffers themselves (answers registered as a
    buffer are weights the reference does not have: the parent compares).
    A look that fails (a candidate's `parameters()` that raises) is {"bytes": -1, "where": [why]}: the
    harness's failure to look is not the candidate's error."""
    try:
        return _find(module, model, harness)
    except Exception as exc:
        return {"bytes": -1, "where": [f"not measured: {type(exc).__name__}: {exc}"[:200]]}


def _find(module: types.ModuleType | None, model: Any, harness: Iterable[Any]) -> dict[str, Any]:
    home = module.__name__ if module is not None else ""
    harness_roots = [("harness", h) for h in harness]
    own = _own_storages(model)
    exclude = set(own) | {key for key, _, _ in _storages(_walk(harness_roots, home))}
    named: dict[tuple[str, int], tuple[str, torch.Tensor]] = {}
    for key, path, tensor in _storages(_walk(_roots(module, model), home)):
        if key not in exclude:
            named.setdefault(key, (path, tensor))
    gc.collect()
    unnamed: dict[tuple[str, int], torch.Tensor] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor):  # type(): no object's __class__ property is run
            key = _storage_key(obj)
            if key is not None and key not in exclude and key not in named:
                unnamed.setdefault(key, obj)
    groups = _group(named)
    if unnamed:
        groups.append(("gc", list(unnamed.items())))
    total = sum(_nbytes(t) for _, items in groups for _, t in items)
    return {"bytes": total, "where": _describe(groups), "weights_bytes": sum(map(_nbytes, own.values()))}


def _own_storages(model: Any) -> dict[tuple[str, int], torch.Tensor]:
    """The model's parameters and buffers, by storage."""
    if not isinstance(model, torch.nn.Module):
        return {}
    own: dict[tuple[str, int], torch.Tensor] = {}
    for t in [*model.parameters(), *model.buffers()]:
        key = _storage_key(t)
        if key is not None:
            own.setdefault(key, t)
    return own


def _roots(module: types.ModuleType | None, model: Any) -> list[tuple[str, Any]]:
    roots = [("model", model)]
    if module is not None:
        name = module.__name__
        for attr, value in list(vars(module).items()):
            if not (attr.startswith("__") and attr.endswith("__")):
                roots.append((f"{name}.{attr}", value))
    return roots


def _walk(roots: list[tuple[str, Any]], home: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor reachable from `roots`, breadth first, each object visited once;
    classes are looked into only when defined in module `home`."""
    seen: set[int] = set()
    frontier = deque((path, obj, 0) for path, obj in roots)
    while frontier and len(seen) < MAX_OBJECTS:
        path, obj, depth = frontier.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            yield path, obj
            continue
        if depth < MAX_DEPTH:
            frontier.extend((p, child, depth + 1) for p, child in _children(path, obj, home))


def _children(path: str, obj: Any, home: str) -> list[tuple[str, Any]]:
    """The objects `obj` holds, with their paths. Builtin accessors only: a candidate's overridden
    `items` or `__iter__` is not called."""
    try:
        if isinstance(obj, dict):
            return [(f"{path}[{_key(k)}]", v) for k, v in dict.items(obj)] + \
                [(f"{path}.<key>", k) for k in dict.keys(obj) if isinstance(k, torch.Tensor)]
        if isinstance(obj, (list, tuple)):
            return [(f"{path}[{i}]", v) for i, v in enumerate(list(obj) if isinstance(obj, list) else tuple(obj))]
        if isinstance(obj, (set, frozenset)):
            return [(f"{path}{{}}", v) for v in (set(obj) if isinstance(obj, set) else frozenset(obj))]
        if isinstance(obj, types.ModuleType) or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
            return []
        if isinstance(obj, types.FunctionType):
            held = list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
            held += [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
            return [(f"{path}.<closure>", v) for v in held]
        if isinstance(obj, type):  # the candidate's own classes: class attributes
            if obj.__module__ != home:
                return []
            return [(f"{path}.{k}", v) for k, v in vars(obj).items() if not k.startswith("__")]
        attrs = object.__getattribute__(obj, "__dict__")
        return [(f"{path}.{k}", v) for k, v in dict.items(attrs)] if isinstance(attrs, dict) else []
    except Exception:  # an object that cannot be looked into holds nothing we can name
        return []


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def _key(k: Any) -> str:
    text = repr(k) if isinstance(k, (str, int, float, tuple)) else f"<{type(k).__name__}>"
    return text if len(text) <= _KEY_CHARS else text[: _KEY_CHARS - 3] + "..."


def _storages(found: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[tuple[str, int], str, torch.Tensor]]:
    for path, tensor in found:
        key = _storage_key(tensor)
        if key is not None:
            yield key, path, tensor


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    """(device, storage address): views of one storage share it. None for tensors without storage."""
    try:
        storage = t.untyped_storage()
        return str(t.device), storage.data_ptr()
    except Exception:  # sparse, meta or wrapper tensors
        return None


def _nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:
        return 0


def _group(named: dict[tuple[str, int], tuple[str, torch.Tensor]]) -> list[tuple[str, list[tuple[Any, torch.Tensor]]]]:
    """Named storages grouped by their root (a global or a model attribute), each group's path the full
    one when it holds one tensor."""
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for path, tensor in named.values():
        groups.setdefault(_root_of(path), []).append((path, tensor))
    return [(items[0][0] if len(items) == 1 else root, items) for root, items in groups.items()]


def _root_of(path: str) -> str:
    """'kbv_candidate.CACHE' of 'kbv_candidate.CACHE['k'][0]'; 'model.answers' of 'model.answers[3]'."""
    head, _, rest = path.partition(".")
    end = len(rest)
    for mark in ".[{":
        at = rest.find(mark)
        if at >= 0:
            end = min(end, at)
    return f"{head}.{rest[:end]}" if rest else head


def _describe(groups: list[tuple[str, list[tuple[Any, torch.Tensor]]]]) -> list[str]:
    sized = sorted(((sum(_nbytes(t) for _, t in items), label, items) for label, items in groups),
                   key=lambda g: -g[0])
    out = []
    for nbytes, label, items in sized[:MAX_WHERE]:
        devices = "+".join(sorted({str(t.device) for _, t in items}))
        count = f"{len(items)} tensor{'s' if len(items) > 1 else ''} " if label == "gc" or len(items) > 1 else ""
        out.append(f"{label}: {count}({devices}, {format_bytes(nbytes)})" if count else
                   f"{label} ({devices}, {format_bytes(nbytes)})")
    if len(sized) > MAX_WHERE:
        out.append(f"... and {len(sized) - MAX_WHERE} more")
    return out


def format_bytes(n: int) -> str:
    """'512.0 MiB', '17.5 KiB', '12 B'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"
