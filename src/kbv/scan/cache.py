"""Result caches in Python source: lookups keyed by pointers/ids/hashes/shapes, pointer equality tests,
memoized functions called with forward's inputs, and forwards that return what an earlier call stored.
Run by the Python scan on its module, which reports the hits.
"""

from __future__ import annotations

import ast
from kbv.scan.names import ModuleScan, _dotted, _flat_targets, _in_order, _text
from kbv.scan.rules import _DICT_MAKERS, _MEMOIZERS, _POINTER_CALLS, _SHAPE_CALLS



class _CacheScan:
    """Caches keyed by pointers/ids/hashes/shapes, memoized forwards, pointer equality tests."""

    def __init__(self, scan: ModuleScan) -> None:
        self.scan, self.names = scan, scan.names
        self.key_vars: dict[str, str] = {}  # name -> "pointer" | "shape"
        self.replay_vars: dict[str, str] = {}  # name bound to a keyed lookup -> its key kind
        self.dicts: set[str] = set()  # last component of names bound to dicts

    def run(self) -> None:
        for node in _in_order(self.scan.tree):
            if isinstance(node, ast.Assign):
                self.bind(node)
        for node in ast.walk(self.scan.tree):
            if isinstance(node, ast.Subscript) and self.is_dict(node.value):
                self.on_lookup(node, node.slice, store=isinstance(node.ctx, ast.Store))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                    and node.func.attr in ("get", "setdefault", "pop", "__getitem__") and self.is_dict(node.func.value):
                self.on_lookup(node, node.args[0], store=node.func.attr == "setdefault")
            elif isinstance(node, ast.Compare):
                self.on_compare(node)
            elif isinstance(node, ast.Return) and isinstance(node.value, ast.Name) \
                    and node.value.id in self.replay_vars:
                kind = self.replay_vars[node.value.id]
                self.scan.hit("KBV-S501" if kind == "pointer" else "KBV-S503", f"return {node.value.id}", node.lineno)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "forward":
                self.on_forward(node)

    def bind(self, node: ast.Assign) -> None:
        if isinstance(node.value, (ast.Dict, ast.DictComp)) or (
                isinstance(node.value, ast.Call) and self.names.qual(node.value.func) in _DICT_MAKERS):
            self.dicts |= {(_dotted(t) or "").rsplit(".", 1)[-1] for t in node.targets}
        kind = self.key_kind(node.value)
        lookup = self.lookup_kind(node.value)
        for target in node.targets:
            names = [target] + (list(target.elts) if isinstance(target, (ast.Tuple, ast.List)) else [])
            for t in (n for n in names if isinstance(n, ast.Name)):
                if kind is not None:
                    self.key_vars[t.id] = kind
                if lookup is not None:
                    self.replay_vars[t.id] = lookup

    def is_dict(self, node: ast.AST) -> bool:
        last = (_dotted(node) or "").rsplit(".", 1)[-1]
        return bool(last) and (last in self.dicts or any(w in last.lower() for w in ("cache", "memo")))

    def key_kind(self, node: ast.AST) -> str | None:
        kinds: set[str] = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Call):
                qual, func = self.names.qual(n.func), n.func
                if qual in ("builtins.id", "builtins.hash"):
                    kinds.add((self.key_kind(n.args[0]) if n.args else None) or "pointer")
                elif isinstance(func, ast.Attribute) and func.attr in _POINTER_CALLS:
                    kinds.add("pointer")
                elif isinstance(func, ast.Attribute) and func.attr in _SHAPE_CALLS:
                    kinds.add("shape")
            elif isinstance(n, ast.Attribute) and n.attr in ("shape", "_cdata"):
                kinds.add("shape" if n.attr == "shape" else "pointer")
            elif isinstance(n, ast.Name) and n.id in self.key_vars:
                kinds.add(self.key_vars[n.id])
        return "pointer" if "pointer" in kinds else ("shape" if kinds else None)

    def lookup_kind(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Subscript) and self.is_dict(node.value):
            return self.key_kind(node.slice)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                and node.func.attr in ("get", "__getitem__") and self.is_dict(node.func.value):
            return self.key_kind(node.args[0])
        return None

    def on_lookup(self, node: ast.AST, key: ast.AST, store: bool) -> None:
        kind = self.key_kind(key)
        if kind is None:
            return
        line, evidence = getattr(node, "lineno", None), _text(node)
        if not store and self.returned(node):
            self.scan.hit("KBV-S501" if kind == "pointer" else "KBV-S503", f"return {evidence}", line)
        elif kind == "pointer":
            self.scan.hit("KBV-S502", evidence, line)
        elif store:
            self.scan.hit("KBV-S504", evidence, line)

    def returned(self, node: ast.AST) -> bool:
        parent = self.scan.parents.get(node)
        while isinstance(parent, ast.expr):
            parent = self.scan.parents.get(parent)
        return isinstance(parent, ast.Return)

    def on_compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if isinstance(op, (ast.In, ast.NotIn)) and self.is_dict(right) and self.key_kind(left) == "pointer":
                self.scan.hit("KBV-S502", _text(node), node.lineno)
            elif isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)) and any(
                    self.is_pointer(a) and not isinstance(b, ast.Constant) for a, b in ((left, right), (right, left))):
                guarded = self.guarded_return(node)
                self.scan.hit("KBV-S501" if guarded else "KBV-S502", _text(node) + (": return" if guarded else ""),
                              node.lineno)

    def guarded_return(self, node: ast.expr) -> bool:
        """Whether `node` is in an if-test whose body returns a value (a fast path taken on a match)."""
        child, parent = node, self.scan.parents.get(node)
        while isinstance(parent, ast.expr):
            child, parent = parent, self.scan.parents.get(parent)
        return isinstance(parent, ast.If) and child is parent.test and any(
            isinstance(n, ast.Return) and n.value is not None for s in parent.body for n in ast.walk(s))

    def is_pointer(self, node: ast.AST) -> bool:
        """A pointer/id expression itself (not arithmetic on one, as in alignment checks)."""
        if isinstance(node, ast.Name):
            return self.key_vars.get(node.id) == "pointer"
        if isinstance(node, ast.Call):
            qual = self.names.qual(node.func)
            return qual in ("builtins.id", "builtins.hash") or (
                isinstance(node.func, ast.Attribute) and node.func.attr in _POINTER_CALLS)
        return False

    def on_forward(self, forward: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.on_replay(forward)
        memoized = {f.name for f in ast.walk(self.scan.tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and any(self.names.qual(d.func if isinstance(d, ast.Call) else d) in _MEMOIZERS
                            for d in f.decorator_list)}
        params = {a.arg for a in (*forward.args.posonlyargs, *forward.args.args, *forward.args.kwonlyargs)} - {"self"}
        for call in (n for n in ast.walk(forward) if isinstance(n, ast.Call)):
            name = (_dotted(call.func) or "").removeprefix("self.")
            args = [*call.args, *(k.value for k in call.keywords)]
            if name in memoized and any(isinstance(a, ast.Name) and a.id in params for a in args):
                self.scan.hit("KBV-S506", f"{name}({_text(args[0], 20)}, ...)", call.lineno)


    def on_replay(self, forward: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """`if <anything>: return self.last` where forward itself stores self.last: last-call replay."""
        stored = {_dotted(t) for n in ast.walk(forward) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                  for t in _flat_targets(n.targets if isinstance(n, ast.Assign) else [n.target])}
        for branch in (n for n in ast.walk(forward) if isinstance(n, ast.If)):
            for ret in (r for s in branch.body for r in ast.walk(s) if isinstance(r, ast.Return)):
                name = _dotted(ret.value) if ret.value is not None else None
                if name is not None and name.startswith("self.") and name in stored:
                    self.scan.hit("KBV-S508", f"if {_text(branch.test, 40)}: return {name}", ret.lineno)
