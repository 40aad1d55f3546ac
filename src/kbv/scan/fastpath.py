"""Input-dependent fast paths: a `forward` that reads its inputs' values on the host to choose a path
(`if x.min() >= 0:`, `while t.any():`, `a if bool(x.sum()) else b`, `if v > 1:` after `v = x.item()`).
Advisory (KBV-S511): a fast path that is correct stays `verified`; the finding tells the reader that the
kernel's speed depends on its data, and the verified timer's pool mixes every distribution.

Values, not metadata: shapes, strides, dtypes, devices, `numel()`, `is_contiguous()` and `len()` are known
without reading the data, so `if x.shape[0] > 4:` does not fire. Run by the Python scan on ModelNew's
forward, which reports the hits.
"""

from __future__ import annotations

import ast
from kbv.scan.names import ModuleScan, _flat_targets, _text


# calls that bring a tensor's values to the host (methods, or torch.<name>(tensor, ...))
_HOST_METHODS = frozenset({"item", "tolist", "numpy", "any", "all", "min", "max", "amin", "amax", "sum", "mean",
                           "std", "var", "norm", "count_nonzero", "nonzero", "equal", "allclose", "isclose",
                           "is_nonzero", "argmax", "argmin", "median", "unique"})
_HOST_BUILTINS = frozenset({"builtins.bool", "builtins.int", "builtins.float", "builtins.any", "builtins.all",
                            "builtins.min", "builtins.max", "builtins.sum"})
# what describes a tensor without reading its values
_METADATA = frozenset({"shape", "size", "stride", "dtype", "device", "ndim", "dim", "numel", "nelement", "layout",
                       "is_cuda", "is_contiguous", "requires_grad", "element_size", "data_ptr", "storage_offset",
                       "is_floating_point", "is_complex", "names", "itemsize", "nbytes"})


class _FastPathScan:
    """Branches of one forward whose test reads input values on the host."""

    def __init__(self, scan: ModuleScan, forward: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scan, self.forward = scan, forward
        self.parents = scan.parents
        args = forward.args
        self.inputs = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} - {"self", "cls"}
        if args.vararg:
            self.inputs.add(args.vararg.arg)
        self.host_values: set[str] = set()  # names bound to values read on the host

    def run(self) -> None:
        self.bind()
        early = {f.line for f in self.scan.found if f.rule == "KBV-S507"}  # the early-return rule says more
        for node in ast.walk(self.forward):
            test = node.test if isinstance(node, (ast.If, ast.While, ast.IfExp)) else None
            if test is None or node.lineno in early:
                continue
            if self.reads_values(test):
                kind = {ast.If: "if", ast.While: "while", ast.IfExp: "... if"}[type(node)]
                self.scan.hit("KBV-S511", f"{kind} {_text(test, 40)}", node.lineno)

    def bind(self) -> None:
        """Names derived from the inputs' values (tensors) and names holding host reads, in order."""
        kinds = (ast.Assign, ast.AnnAssign, ast.AugAssign)
        assigns = sorted((n for n in ast.walk(self.forward) if isinstance(n, kinds) and n.value is not None),
                         key=lambda n: (n.lineno, n.col_offset))
        for node in assigns:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in _flat_targets(targets) if isinstance(t, ast.Name)}  # not `self.k = ...`
            if self.reads_values(node.value):
                self.host_values |= names
            elif self.value_mentions(node.value):
                self.inputs |= names

    def reads_values(self, expr: ast.AST) -> bool:
        """Whether evaluating `expr` brings input values to the host."""
        for n in ast.walk(expr):
            if isinstance(n, ast.Name) and n.id in self.host_values:
                return True
            if isinstance(n, ast.Call) and self.host_call(n):
                return True
            if isinstance(n, ast.Compare) and any(
                    isinstance(side, ast.Subscript) and self.value_mentions(side)
                    for side in (n.left, *n.comparators)):  # `x[0, 0] > 0`: one element, read on the host
                return True
        return False

    def host_call(self, call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in _HOST_METHODS and self.value_mentions(func.value):
            return True
        qual = self.scan.names.qual(func) or ""
        if qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in _HOST_METHODS:
            return any(self.value_mentions(a) for a in call.args)
        return qual in _HOST_BUILTINS and any(self.value_mentions(a) for a in call.args)

    def value_mentions(self, expr: ast.AST) -> bool:
        """`expr` uses an input's values: an input name not merely described (`x.shape`, `len(x)`)."""
        return any(isinstance(n, ast.Name) and n.id in self.inputs and not self.described(n) for n in ast.walk(expr))

    def described(self, name: ast.Name) -> bool:
        parent = self.parents.get(name)
        if isinstance(parent, ast.Attribute) and parent.value is name:
            return parent.attr in _METADATA
        return isinstance(parent, ast.Call) and parent.args[:1] == [name] and \
            (self.scan.names.qual(parent.func) or "") in ("builtins.len", "builtins.isinstance", "builtins.type")
