"""Input-dependent fast paths: a `forward` that reads its inputs' values on the host to choose a path
(`if x.min() >= 0:`, `while t.any():`, `a if bool(x.sum()) else b`), directly or through a local name
(`ok = bool(x.min() >= 0)` ... `if ok:`). Two rules, both warnings and advisory (a fast path that is
correct stays `verified`; the finding tells the reader that the kernel's speed depends on its data, and
the verified timer's pool mixes every distribution):

    KBV-S507  an `if` on such a test whose branch returns: forward returns early on a statistic
    KBV-S511  any other branch on such a test (`while`, `... if ... else ...`, an `if` that picks
              another computation)

Values, not metadata: shapes, strides, dtypes, devices, `numel()`, `is_contiguous()`, `len()` and
identity (`is None`) are known without reading the data, so `if x.shape[0] > 4:` does not fire, nor
does a statistic used only in arithmetic (`y = x / x.abs().max()`) or only described (`m.dim()`).
Run by the Python scan on ModelNew's forward, which reports the hits.
"""

from __future__ import annotations

import ast

from kbv.scan.names import ModuleScan, _flat_targets, _text, _walk_all

# methods that reduce or read a tensor's values (on the device or straight to the host): their result
# is a statistic of the input, and a branch on it reads it on the host
_HOST_METHODS = frozenset({"item", "tolist", "numpy", "any", "all", "min", "max", "amin", "amax", "aminmax", "sum",
                           "mean", "prod", "std", "var", "norm", "count_nonzero", "nonzero", "equal", "allclose",
                           "isclose", "is_nonzero", "argmax", "argmin", "median", "unique"})
# of those, the ones that copy values to the host: whatever is computed from their result is host data
_TRANSFERS = frozenset({"item", "tolist", "numpy"})
_HOST_BUILTINS = frozenset({"builtins.bool", "builtins.int", "builtins.float", "builtins.any", "builtins.all",
                            "builtins.min", "builtins.max", "builtins.sum"})
# where a call on statistics alone gives a statistic (`abs(s)`, `math.isfinite(s)`, `torch.isnan(s)`)
_SCALAR_ROOTS = ("builtins.", "math.", "torch.", "numpy.")
# what describes a tensor without reading its values
_METADATA = frozenset({"shape", "size", "stride", "dtype", "device", "ndim", "dim", "numel", "nelement", "layout",
                       "is_cuda", "is_contiguous", "requires_grad", "element_size", "data_ptr", "storage_offset",
                       "is_floating_point", "is_complex", "names", "itemsize", "nbytes"})
_IDENTITY = (ast.Is, ast.IsNot)
_BINDINGS = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)


class _FastPathScan:
    """Branches of one forward whose test reads input values on the host.

    Two kinds of local names are followed, in source order: `inputs`, tensors whose values derive from
    the arguments (`y = x.contiguous()`, `z = x / s`), and `stats`, statistics of those values
    (`s = x.sum()`, `ok = bool(s > 0)`, `v = x.min().item() >= 0`). A test reads values when it
    reduces an input there (`x.min() >= 0`), uses a statistic's value (`if ok:`, `if s > 1:`), or
    compares one element (`x[0, 0] > 0`)."""

    def __init__(self, scan: ModuleScan, forward: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scan, self.forward = scan, forward
        self.parents = scan.parents
        args = forward.args
        self.inputs = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} - {"self", "cls"}
        if args.vararg:
            self.inputs.add(args.vararg.arg)
        self.stats: set[str] = set()

    def run(self) -> None:
        self.bind()
        for node in ast.walk(self.forward):
            if not isinstance(node, (ast.If, ast.While, ast.IfExp)) or not self.reads_values(node.test):
                continue
            if isinstance(node, ast.If) and _returns(node):
                self.scan.hit("KBV-S507", f"if {_text(node.test, 40)}: return", node.lineno)
            else:
                kind = {ast.If: "if", ast.While: "while", ast.IfExp: "... if"}[type(node)]
                self.scan.hit("KBV-S511", f"{kind} {_text(node.test, 40)}", node.lineno)

    def bind(self) -> None:
        """Sort the local names bound in forward into statistics and input-derived tensors, in order."""
        nodes = sorted((n for n in ast.walk(self.forward) if isinstance(n, _BINDINGS) and n.value is not None),
                       key=lambda n: (n.lineno, n.col_offset))
        for node in nodes:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in _flat_targets(targets) if isinstance(t, ast.Name)}  # not `self.k = ...`
            if self.is_statistic(node.value):
                self.stats |= names
            elif self.value_mentions(node.value):
                self.inputs |= names

    def is_statistic(self, expr: ast.AST) -> bool:
        """`expr` evaluates to a statistic of input values (a reduction, a host read, a test of one)."""
        if isinstance(expr, ast.Name):
            return expr.id in self.stats
        if isinstance(expr, ast.Call):  # `hash(x.numpy().tobytes())`: computed from values on the host
            return self.host_call(expr) or self.call_on_statistics(expr) or any(
                isinstance(n, ast.Call) and self.transfer(n) for n in ast.walk(expr))
        if isinstance(expr, ast.Compare):
            if all(isinstance(op, _IDENTITY) for op in expr.ops):
                return False
            sides = (expr.left, *expr.comparators)
            return any(self.is_statistic(s) or (isinstance(s, ast.Subscript) and self.value_mentions(s))
                       for s in sides)  # `x[0, 0] > 0`: one element, read on the host
        if isinstance(expr, ast.BoolOp):
            return any(self.is_statistic(v) for v in expr.values)
        if isinstance(expr, ast.UnaryOp):
            return self.is_statistic(expr.operand)
        if isinstance(expr, ast.BinOp):  # `s * 2` is one; `x / s`, a tensor, is not
            sides = (expr.left, expr.right)
            return any(self.is_statistic(s) for s in sides) and not any(self.tensor_mentions(s) for s in sides)
        if isinstance(expr, (ast.Subscript, ast.Attribute)):  # `lohi[0]`, `x.max(dim=1).values`; not `s.shape`
            return not (isinstance(expr, ast.Attribute) and expr.attr in _METADATA) and self.is_statistic(expr.value)
        if isinstance(expr, ast.IfExp):
            return self.is_statistic(expr.body) or self.is_statistic(expr.orelse)
        if isinstance(expr, (ast.Tuple, ast.List)):  # `lo, hi = x.min(), x.max()`
            return any(self.is_statistic(e) for e in expr.elts)
        return False

    def call_on_statistics(self, call: ast.Call) -> bool:
        """`s.item()`, `s.float()`, `abs(s)`, `torch.isnan(s)`: a statistic turned into another."""
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr not in _METADATA and self.is_statistic(func.value):
            return True
        qual = self.scan.names.qual(func) or ""
        args = [*call.args, *(k.value for k in call.keywords)]
        return qual.startswith(_SCALAR_ROOTS) and any(self.is_statistic(a) for a in args) \
            and not any(self.tensor_mentions(a) for a in args)

    def reads_values(self, test: ast.AST) -> bool:
        """Whether evaluating the branch test `test` brings input values to the host."""
        for n in ast.walk(test):
            if isinstance(n, ast.Name) and n.id in self.stats and not self.described(n):
                return True
            if isinstance(n, ast.Call) and self.host_call(n):
                return True
            if isinstance(n, ast.Compare) and self.is_statistic(n):
                return True
        return False

    def host_call(self, call: ast.Call) -> bool:
        """A reduction or host read of input values: `x.min()`, `torch.all(x >= 0)`, `bool(x.sum())`."""
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in _HOST_METHODS and self.value_mentions(func.value):
            return True
        qual = self.scan.names.qual(func) or ""
        if qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in _HOST_METHODS:
            return any(self.value_mentions(a) for a in call.args)
        return qual in _HOST_BUILTINS and any(self.value_mentions(a) for a in call.args)

    def transfer(self, call: ast.Call) -> bool:
        """`x.item()`, `x.tolist()`, `x.numpy()` of input values."""
        func = call.func
        return isinstance(func, ast.Attribute) and func.attr in _TRANSFERS and self.value_mentions(func.value)

    def value_mentions(self, expr: ast.AST) -> bool:
        """`expr` uses input values: an input or statistic not merely described (`x.shape`, `len(x)`)."""
        return any(isinstance(n, ast.Name) and (n.id in self.inputs or n.id in self.stats) and not self.described(n)
                   for n in ast.walk(expr))

    def tensor_mentions(self, expr: ast.AST) -> bool:
        """`expr` uses an input-derived tensor's values (a statistic does not count)."""
        return any(isinstance(n, ast.Name) and n.id in self.inputs and not self.described(n) for n in ast.walk(expr))

    def described(self, name: ast.Name) -> bool:
        """`name` is only described: its metadata (`x.dim()`), `len`/`isinstance`/`type`, or identity."""
        parent = self.parents.get(name)
        if isinstance(parent, ast.Attribute) and parent.value is name:
            return parent.attr in _METADATA
        if isinstance(parent, ast.Compare):
            return all(isinstance(op, _IDENTITY) for op in parent.ops)
        return isinstance(parent, ast.Call) and parent.args[:1] == [name] and \
            (self.scan.names.qual(parent.func) or "") in ("builtins.len", "builtins.isinstance", "builtins.type")


def _returns(node: ast.If) -> bool:
    """Either branch of `node` returns from forward."""
    return any(isinstance(n, ast.Return) for n in _walk_all([*node.body, *node.orelse]))
