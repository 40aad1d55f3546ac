"""Name and string resolution over one Python module, statically: names are resolved through imports,
assignments and getattr chains (`getattr(getattr(torch, "cuda"), "Ev" + "ent")` is `torch.cuda.Event`),
strings through concatenation, joins, f-strings and decoding. Also the small syntax-tree helpers the
scans share.
"""

from __future__ import annotations

import ast
import base64
import binascii
import builtins
import codecs
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

_BUILTIN_NAMES = frozenset(dir(builtins)) | {"exit", "quit"}


class ModuleScan(Protocol):
    """What the rule groups run on a module (cache.py, fastpath.py) need of the Python scan driving them."""

    tree: ast.Module
    names: _Names
    parents: dict[ast.AST, ast.AST]
    found: list[Any]

    def hit(self, rule_id: str, evidence: str, line: int | None, source: str = "python", where: str = "") -> None: ...


class _Names:
    """Flow-insensitive bindings of one module: which names stand for modules/attributes, which for strings.

    `qual(node)` is the dotted name an expression stands for ("torch.cuda.Event"), through imports, aliases
    (`E = torch.cuda.Event`, `self.t = torch`), getattr chains, `__import__`, `sys.modules[...]`, `vars(m)`;
    `string(node)` the value of a string expression built from literals (concatenation, join, f-strings,
    chr, reversal, base64/hex/rot13 decoding).
    """

    def __init__(self, tree: ast.Module) -> None:
        self.aliases: dict[str, str] = {}
        self.strings: dict[str, str] = {}
        self.literal: set[str] = set()  # names bound to a plain string literal
        self.values: dict[str, ast.expr] = {}  # name -> the expression last bound to it
        self.bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self.bound |= {n.name for n in ast.walk(tree)
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        self.bound |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
                       for a in (*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg) if a is not None}
        for node in _in_order(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._bind_import(node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    self._bind(target, node.value)
            elif isinstance(node, ast.ClassDef):  # class attributes are reached as Cls.x and self.x too
                for stmt in (b for b in node.body if isinstance(b, ast.Assign)):
                    for t in (t for t in stmt.targets if isinstance(t, ast.Name)):
                        for prefix in (node.name, "self"):
                            self._bind(ast.Attribute(ast.Name(prefix, ast.Load()), t.id, ast.Store()), stmt.value)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                self._bind(node.target, node.value)
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
                key, extra = _dotted(node.target), self.string(node.value)
                if key in self.strings and extra is not None:
                    self.strings[key] += extra
                    self.literal.discard(key)

    def _bind_import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if isinstance(node, ast.Import):
                name = alias.asname or alias.name.split(".")[0]
                self.aliases[name] = alias.name if alias.asname else name
            elif node.module and not node.level and alias.name != "*":
                self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            for t, v in zip(target.elts, value.elts):
                self._bind(t, v)
            return
        key = _dotted(target)
        if key is None:
            return
        self.values[key] = value
        qual, text = self.qual(value), self.string(value)
        if qual is not None:
            self.aliases[key] = qual
        if text is not None:
            self.strings[key] = text
            if isinstance(value, ast.Constant):
                self.literal.add(key)

    def qual(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            if node.id == "__builtins__":
                return "builtins"
            return f"builtins.{node.id}" if node.id in _BUILTIN_NAMES and node.id not in self.bound else None
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is not None and dotted in self.aliases:
                return self.aliases[dotted]
            if node.attr == "__class__" and isinstance(node.value, ast.Call):  # torch.cuda.Event().__class__
                return self.qual(node.value.func)
            base = self.qual(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            return self._call_qual(node)
        if isinstance(node, ast.Subscript):
            base, key = self.qual(node.value), self.string(node.slice)
            if base == "sys.modules":
                return key
            if base is not None and (base == "builtins" or base.endswith(".__dict__")):
                return f"{base.removesuffix('.__dict__')}.{key or '?'}"
        return None

    def _call_qual(self, node: ast.Call) -> str | None:
        func = self.qual(node.func)
        if func == "builtins.getattr" and len(node.args) >= 2:
            base, name = self.qual(node.args[0]), self.string(node.args[1])
            return f"{base}.{name or '?'}" if base else None
        if func in ("builtins.__import__", "importlib.import_module") and node.args:
            return self.string(node.args[0])
        if func == "builtins.type" and len(node.args) == 1 and isinstance(node.args[0], ast.Call):
            return self.qual(node.args[0].func)  # type(torch.cuda.Event()) is torch.cuda.Event
        if func == "builtins.vars" and node.args:
            base = self.qual(node.args[0])
            return f"{base}.__dict__" if base else None
        return None

    def string(self, node: ast.AST | None) -> str | None:
        """The value of a string expression built from literals, or None."""
        if node is None:
            return None
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, (ast.Name, ast.Attribute)):
            return self.strings.get(_dotted(node) or "")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            parts = [self.string(p) for p in _add_operands(node)]
            return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[arg-type]
        if isinstance(node, ast.JoinedStr):
            parts = [self.string(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values]
            return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[arg-type]
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            text, s = self.string(node.value), node.slice
            step = s.step.value if isinstance(s.step, ast.Constant) else None
            return text[::-1] if text is not None and s.lower is None and s.upper is None and step == -1 else None
        if isinstance(node, ast.Call):
            return self._call_string(node)
        return None

    def _call_string(self, node: ast.Call) -> str | None:
        func, args = node.func, node.args
        if isinstance(func, ast.Attribute) and func.attr == "join" and len(args) == 1:
            sep = self.string(func.value)
            items = [self.string(e) for e in getattr(args[0], "elts", [None])]
            return None if sep is None or any(i is None for i in items) else sep.join(items)  # type: ignore[arg-type]
        if self.qual(func) == "builtins.chr" and args and isinstance(args[0], ast.Constant):
            value = args[0].value
            return chr(value) if isinstance(value, int) and 0 <= value < 0x110000 else None
        if self.qual(func) == "codecs.decode" and len(args) == 2 and self.string(args[1]) in ("rot13", "rot_13"):
            text = self.string(args[0])
            return codecs.decode(text, "rot13") if text is not None else None
        if isinstance(func, ast.Attribute) and func.attr == "decode":
            data = self.bytes_value(func.value)
            try:
                return data.decode() if data is not None else None
            except UnicodeDecodeError:
                return None
        return None

    def bytes_value(self, node: ast.AST) -> bytes | None:
        """The value of a bytes expression: a literal, an encoded known string, or a base64/hex decoding."""
        if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
            return node.value
        if not isinstance(node, ast.Call) or len(node.args) != 1:
            return None
        func, arg = self.qual(node.func), node.args[0]
        if isinstance(node.func, ast.Attribute) and node.func.attr == "encode":
            text = self.string(node.func.value)
            return text.encode() if text is not None else None
        data = self.string(arg)
        data_b = self.bytes_value(arg) if data is None else data.encode()
        decoders = {"base64.b64decode": base64.b64decode, "base64.urlsafe_b64decode": base64.urlsafe_b64decode,
                    "base64.b32decode": base64.b32decode, "base64.b16decode": base64.b16decode,
                    "base64.b85decode": base64.b85decode, "binascii.unhexlify": binascii.unhexlify,
                    "builtins.bytes.fromhex": lambda b: bytes.fromhex(b.decode())}
        if func not in decoders or data_b is None:
            return None
        try:
            return decoders[func](data_b)  # type: ignore[operator]
        except (ValueError, binascii.Error):
            return None

    def computed(self, node: ast.AST) -> bool:
        """A string known statically but not written as a literal (concatenated, joined, decoded, ...)."""
        if isinstance(node, ast.Constant) or self.string(node) is None:
            return False
        return not (isinstance(node, (ast.Name, ast.Attribute)) and _dotted(node) in self.literal)


def _in_order(tree: ast.AST) -> list[ast.AST]:
    nodes = [n for n in ast.walk(tree) if hasattr(n, "lineno")]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _dotted(node: ast.AST) -> str | None:
    """'a.b.c' for a chain of names and attributes, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _add_operands(node: ast.BinOp) -> list[ast.expr]:
    """The operands of a + b + c ..., iteratively (long concatenations must not recurse)."""
    out: list[ast.expr] = []
    stack: list[ast.expr] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            stack += [n.right, n.left]
        else:
            out.append(n)
    return out


def _text(node: ast.AST, limit: int = 60) -> str:
    try:
        text = ast.unparse(node)
    except (RecursionError, ValueError):
        text = type(node).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _walk_all(stmts: list[ast.stmt]) -> Iterator[ast.AST]:
    return (n for stmt in stmts for n in ast.walk(stmt))


def _flat_targets(targets: Iterable[ast.expr]) -> Iterator[ast.expr]:
    for t in targets:
        if isinstance(t, (ast.Tuple, ast.List)):
            yield from _flat_targets(t.elts)
        else:
            yield t


def _prefix_match(qual: str, table: dict[str, str]) -> str | None:
    """The longest key of `table` equal to `qual` or a dotted prefix of it."""
    parts = qual.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in table:
            return key
    return None


def _keyword(node: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in node.keywords if k.arg == name), None)


def _constant_in(node: ast.AST | None, values: tuple[object, ...]) -> bool:
    return isinstance(node, ast.Constant) and any(node.value is v or (
        type(node.value) is type(v) and node.value == v) for v in values)
