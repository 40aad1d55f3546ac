"""The Python scan: every rule over one parsed module, on its syntax tree, so strings and comments
neither hide nor fake a match. Names are resolved by `_Names` (names.py); string contents are judged by
cpp.py, and an embedded finding's line is absolute: the string's line in the file plus its line within
the string (approximate for implicit concatenations spread over several lines).
"""

from __future__ import annotations

import ast
from collections import Counter

from kbv.scan.cache import _CacheScan
from kbv.scan.cpp import (
    _CUDA_MARKERS,
    _cpp_hits,
    _looks_like_cpp,
    _python_string_hits,
    cpp_kernels,
    cpp_tokens,
)
from kbv.scan.fastpath import _FastPathScan
from kbv.scan.names import (
    _constant_in,
    _dotted,
    _flat_targets,
    _in_order,
    _keyword,
    _Names,
    _prefix_match,
    _text,
)
from kbv.scan.rules import (
    _ATTR_RULES,
    _DECODER_TABLE,
    _HARNESS_SOURCES,
    _HEAVY,
    _KERNEL_MODULES,
    _LOW_DTYPES,
    _MEMOIZERS,
    _MODULE_RULES,
    _OPEN_FUNCS,
    _PATCH_ROOTS,
    _QUAL_RULES,
    _REDUCED_FLAGS,
    _STRICT_VALUES,
    _TIMER_PARTS,
    _TORCH_GLUE,
    _TORCH_HELPERS,
    RULES,
    _finding,
)
from kbv.verdict import Finding

_TRY_NODES = (ast.Try, getattr(ast, "TryStar", ast.Try))  # try/except* is Python 3.11+


def _scan(code: str, fp32: bool, depth: int) -> list[Finding]:
    try:
        tree = ast.parse(code)
        return _PythonScan(tree, fp32, depth).run()
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None)
        return [_finding("KBV-S001", f"{type(exc).__name__}: {getattr(exc, 'msg', None) or exc}", line)]


class _PythonScan:
    """Every rule over one parsed module; `run()` returns the findings (not yet deduplicated)."""

    def __init__(self, tree: ast.Module, fp32: bool, depth: int) -> None:
        self.tree, self.fp32, self.depth = tree, fp32, depth
        self.names = _Names(tree)
        self.parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        self.found: list[Finding] = []
        self.imported_rules: set[str] = set()
        self.has_kernel = False
        self.layers = self.layer_attrs()
        self.cpp_ids: Counter[str] = Counter()  # identifiers of every embedded C++ literal
        self.cpp_kernels: list[tuple[str, int]] = []  # __global__ functions: (name, line)
        self.tainted = self.harness_objects()

    def hit(self, rule_id: str, evidence: str, line: int | None, source: str = "python", where: str = "") -> None:
        if RULES[rule_id].fp32_only and not self.fp32:
            return
        self.found.append(_finding(rule_id, evidence, line, source, where))

    def run(self) -> list[Finding]:
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.on_import(node)
        for node in ast.walk(self.tree):
            self.visit(node)
        model_new = next((n for n in self.tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
        if model_new is not None:
            self.on_model_new(model_new)
        _CacheScan(self).run()
        self.scan_strings()  # sets has_kernel on any C++/CUDA source
        self.scan_decoys()
        if model_new is not None and not self.has_kernel:
            self.hit("KBV-S708", "ModelNew", model_new.lineno)
        return self.found

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            self.on_assign(node)
        elif isinstance(node, ast.Call):
            self.on_call(node)
        elif isinstance(node, _TRY_NODES):
            self.on_try(node)
        elif isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if self.names.qual(exc) == "builtins.SystemExit":
                self.hit("KBV-S809", "raise SystemExit", node.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.on_function(node)
        elif isinstance(node, ast.ClassDef):
            if any(self.names.qual(b) in ("torch.Tensor", "torch._C.TensorBase") for b in node.bases):
                self.hit("KBV-S403", f"class {node.name}(torch.Tensor)", node.lineno)
        if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) and not isinstance(
                getattr(node, "ctx", None), (ast.Store, ast.Del)):
            self.on_use(node)

    # imports and uses

    def on_import(self, node: ast.Import | ast.ImportFrom) -> None:
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [f"{node.module}.{a.name}" for a in node.names] if node.module and not node.level else [])
        for module in modules:
            if module.split(".")[0] in _KERNEL_MODULES or module.startswith("torch.utils.cpp_extension"):
                self.has_kernel = True
            key = _prefix_match(module, _MODULE_RULES)
            if key is not None:
                self.imported_rules.add(key)
                self.hit(_MODULE_RULES[key], f"import {key}", node.lineno)
        if isinstance(node, ast.ImportFrom) and any(a.name == "Model" for a in node.names):
            self.hit("KBV-S703", f"from {'.' * node.level}{node.module or ''} import Model", node.lineno)

    def harness_objects(self) -> set[str]:
        """Names bound (by assignment, for-loop or comprehension) to objects reached through sys.modules, gc or
        frames: whatever they are, they belong to someone else."""
        tainted: set[str] = set()
        bindings = [(n.targets, n.value) for n in _in_order(self.tree) if isinstance(n, ast.Assign)]
        bindings += [([n.target], n.iter) for n in ast.walk(self.tree) if isinstance(n, (ast.For, ast.comprehension))]
        for _ in range(3):  # chains: modules -> module -> cls
            for targets, value in bindings:
                if self.reaches_harness(value, tainted):
                    tainted |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        return tainted

    def reaches_harness(self, expr: ast.AST, tainted: set[str] | None = None) -> bool:
        tainted = self.tainted if tainted is None else tainted
        for n in ast.walk(expr):
            if isinstance(n, ast.Name) and n.id in tainted:
                return True
            if isinstance(n, ast.Attribute) and n.attr in ("f_globals", "f_locals", "__globals__", "f_back"):
                return True
            qual = self.names.qual(n) if isinstance(n, (ast.Name, ast.Attribute)) else None
            if qual is not None and _prefix_match(qual, _HARNESS_SOURCES) is not None:
                return True
        return False

    def on_use(self, node: ast.AST) -> None:
        line = getattr(node, "lineno", None)
        if isinstance(node, ast.Attribute) and node.attr in _ATTR_RULES:
            self.hit(_ATTR_RULES[node.attr], f".{node.attr}", line)
        if isinstance(node, ast.Attribute) and node.attr in ("half", "bfloat16") and self.is_called(node):
            self.hit("KBV-S601", f".{node.attr}()", line)
        qual = self.names.qual(node)
        if qual is None:
            return
        if qual.startswith(("torch.utils.cpp_extension", "torch.ops.load_library", "triton.jit", "triton.autotune")) \
                or qual.split(".")[0] in _KERNEL_MODULES:
            self.has_kernel = True
        key = _prefix_match(qual, _QUAL_RULES)
        if key is not None:
            self.hit(_QUAL_RULES[key], key.removeprefix("builtins."), line)
        key = _prefix_match(qual, _MODULE_RULES)
        dynamic = key is not None and key not in self.imported_rules  # reached without an import statement
        if dynamic and (key != "builtins" or qual == "builtins"):  # not every use of print()
            self.hit(_MODULE_RULES[key], qual, line)
        if _is_low_precision(qual) and not self.in_compare(node):
            self.hit("KBV-S601", qual, line)

    def is_called(self, node: ast.AST) -> bool:
        parent = self.parents.get(node)
        return isinstance(parent, ast.Call) and parent.func is node

    def in_compare(self, node: ast.AST) -> bool:
        """A dtype test (`x.dtype == torch.float16`), not a cast."""
        parent = self.parents.get(node)
        while isinstance(parent, (ast.Tuple, ast.List, ast.Set)):
            parent = self.parents.get(parent)
        return isinstance(parent, ast.Compare)

    # patches

    def on_assign(self, node: ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete) -> None:
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        value = getattr(node, "value", None)
        verb = "del" if isinstance(node, ast.Delete) else "assignment to"
        for target in _flat_targets(targets):
            if not isinstance(target, (ast.Attribute, ast.Subscript)):
                continue
            resolved = self.names.qual(target.value) if isinstance(target, ast.Attribute) else self.names.qual(target)
            if resolved is not None and isinstance(target, ast.Attribute):
                resolved = f"{resolved}.{target.attr}"
            if resolved is not None and resolved.split(".")[0] in _PATCH_ROOTS:
                self.patched(resolved, f"{verb} {_text(target)}", node.lineno, value)
            elif self.reaches_harness(target.value):
                self.hit("KBV-S302", f"{verb} {_text(target)} (reached through sys.modules, gc or frames)",
                         node.lineno)

    def patched(self, target: str, evidence: str, line: int, value: ast.AST | None) -> None:
        parts = target.split(".")
        if parts[0] not in _PATCH_ROOTS:
            return
        if evidence.split(" ", 2)[-1] != target:
            evidence += f" ({target})"
        if target.startswith("torch.backends."):
            reduced = parts[-1] in _REDUCED_FLAGS and not _constant_in(value, _STRICT_VALUES)
            self.hit("KBV-S604" if reduced else "KBV-S605", evidence, line)
        elif parts[0] in ("time", "timeit") or _TIMER_PARTS & set(parts[1:]):
            self.hit("KBV-S301", evidence, line)
        else:
            self.hit("KBV-S302", evidence, line)

    def on_call(self, node: ast.Call) -> None:
        func = self.names.qual(node.func)
        args, line = node.args, node.lineno
        if func in ("builtins.setattr", "builtins.delattr", "builtins.object.__setattr__",
                    "builtins.type.__setattr__", "builtins.object.__delattr__") and len(args) >= 2:
            self.on_setattr(args[0], args[1], args[2] if len(args) > 2 else None, node)
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("__setattr__", "__delattr__") and args:
            self.on_setattr(node.func.value, args[0], args[1] if len(args) > 1 else None, node)
        if func in ("builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.hasattr") \
                and len(args) >= 2 and self.names.computed(args[1]):
            self.hit("KBV-S303", f"{func.split('.')[-1]}(..., {self.names.string(args[1])!r})", line)
        if func in ("builtins.exec", "builtins.eval", "builtins.compile") and args:
            self.on_exec(node, func.split(".")[-1])
        elif func in _OPEN_FUNCS:
            mode = args[1] if len(args) > 1 else _keyword(node, "mode")
            text = self.names.string(mode) if mode is not None else "r"
            if text is None or set(text) & set("wax+"):
                self.hit("KBV-S806", f"{_text(node)}", line)
        elif func == "torch.set_float32_matmul_precision":
            strict = _constant_in(args[0] if args else None, _STRICT_VALUES)
            self.hit("KBV-S605" if strict else "KBV-S604", _text(node), line)
        elif func in ("torch.use_deterministic_algorithms", "torch.set_flush_denormal"):
            self.hit("KBV-S605", _text(node), line)
        elif func == "triton.language.dot":
            self.on_tl_dot(node)

    def on_setattr(self, obj: ast.AST, name_node: ast.AST, value: ast.AST | None, call: ast.Call) -> None:
        base, name = self.names.qual(obj), self.names.string(name_node)
        evidence = f"setattr({_text(obj, 30)}, {name!r})" if name else _text(call)
        if base is not None and base.split(".")[0] in _PATCH_ROOTS:
            self.patched(f"{base}.{name or '?'}", evidence, call.lineno, value)
        elif self.reaches_harness(obj):
            self.hit("KBV-S302", f"{evidence} (reached through sys.modules, gc or frames)", call.lineno)
        elif name in ("elapsed_time", "perf_counter", "do_bench") and _dotted(obj) not in ("self", "cls"):
            self.hit("KBV-S301", evidence, call.lineno)  # a timer's name on an object we could not resolve

    def on_exec(self, node: ast.Call, name: str) -> None:
        arg = node.args[0]
        sources = [arg, *(self.names.values[n.id] for n in ast.walk(arg)
                          if isinstance(n, ast.Name) and n.id in self.names.values)]
        calls = (n for s in sources for n in ast.walk(s) if isinstance(n, ast.Call))
        if any(_prefix_match(self.names.qual(c.func) or "", _DECODER_TABLE) is not None for c in calls):
            self.hit("KBV-S803", f"{name}({_text(arg, 40)})", node.lineno)
        code = self.names.string(arg)
        if code is None:
            data = self.names.bytes_value(arg)
            code = data.decode(errors="replace") if data is not None else None
        if code is not None and self.depth < 3:  # scan what it runs, reported on this line
            for f in _scan(code, self.fp32, self.depth + 1):
                if f.rule != "KBV-S001":
                    self.found.append(Finding(f.rule, f.category, f.severity, f"{name}'d code: {f.message}",
                                              node.lineno, f.source))

    def on_tl_dot(self, node: ast.Call) -> None:
        precision, allow = _keyword(node, "input_precision"), _keyword(node, "allow_tf32")
        if precision is not None and not _constant_in(precision, ("ieee",)):
            self.hit("KBV-S602", f"tl.dot(..., input_precision={_text(precision, 20)})", node.lineno)
        elif allow is not None and not _constant_in(allow, (False,)):
            self.hit("KBV-S602", f"tl.dot(..., allow_tf32={_text(allow, 20)})", node.lineno)
        elif precision is None and allow is None:
            self.hit("KBV-S603", "tl.dot", node.lineno)

    # fallbacks, classes, functions

    def on_try(self, node: ast.Try) -> None:
        for handler in node.handlers:
            calls = self.compute_calls(handler.body, in_forward=False)
            if calls:
                self.hit("KBV-S705", f"except at line {handler.lineno} calls {calls[0][0]}", handler.lineno)

    def compute_calls(self, body: list[ast.stmt], in_forward: bool) -> list[tuple[str, int]]:
        """(evidence, line) of each torch compute call (or `@`, nn layer, .forward call) under `body`.

        In forward, tensor glue (torch.cat, torch.reshape, ...) is not compute; in an except handler
        anything torch computes is a fallback, and so is calling some forward."""
        layers = self.layers
        out: list[tuple[str, int]] = []
        for node in (n for stmt in body for n in ast.walk(stmt)):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                out.append(("@", node.lineno))
            if not isinstance(node, ast.Call):
                continue
            qual, func = self.names.qual(node.func), node.func
            last = qual.rsplit(".", 1)[-1] if qual else ""
            if qual and qual.startswith("torch.") and last not in _TORCH_HELPERS and not (in_forward and (
                    last in _TORCH_GLUE or last.startswith("_") or qual.startswith(("torch.cuda.", "torch.compile")))):
                out.append((qual, node.lineno))
            elif _dotted(func) in layers:
                out.append((f"{_dotted(func)} ({layers[_dotted(func) or '']})", node.lineno))
            elif isinstance(func, ast.Attribute) and qual is None and (
                    func.attr in _HEAVY or (func.attr == "forward" and not in_forward)):
                out.append((f".{func.attr}()", node.lineno))
        return out

    def layer_attrs(self) -> dict[str, str]:
        """self.<name> -> torch.nn class, for attributes assigned an nn layer."""
        out: dict[str, str] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                qual = self.names.qual(node.value.func) or ""
                last = qual.rsplit(".", 1)[-1]
                if qual.startswith("torch.nn.") and last[:1].isupper() and not last.startswith(("Parameter", "Module")):
                    out.update({d: qual for t in node.targets if (d := _dotted(t)) and d.startswith("self.")})
        return out

    def on_model_new(self, cls: ast.ClassDef) -> None:
        methods = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for base in cls.bases:
            name = (self.names.qual(base) or _dotted(base) or "").rsplit(".", 1)[-1]
            if name == "Model":
                rule = "KBV-S702" if "forward" in methods else "KBV-S701"
                self.hit(rule, f"class ModelNew({_text(base)})", cls.lineno)
        forward = methods.get("forward")
        if forward is None:
            return
        for evidence, line in self.compute_calls(forward.body, in_forward=True):
            self.hit("KBV-S707", evidence, line)
        _FastPathScan(self, forward).run()

    def on_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.hit("KBV-S403", f"def {node.name}", node.lineno)
        for dec in node.decorator_list:
            qual = self.names.qual(dec.func if isinstance(dec, ast.Call) else dec) or ""
            if qual.startswith(("triton.jit", "triton.autotune", "triton.heuristics")):
                self.has_kernel = True
            if qual in _MEMOIZERS and node.name in ("forward", "__call__"):
                self.hit("KBV-S505", f"@{qual.split('.')[-1]} def {node.name}", dec.lineno)

    # strings: embedded C++/CUDA and telling Python literals

    def scan_strings(self) -> None:
        parts: list[tuple[str, int]] = []
        composites: list[tuple[str, int]] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and not isinstance(self.parents.get(node), ast.JoinedStr):
                parts.append((node.value, node.lineno))
            elif isinstance(node, ast.JoinedStr):
                text = self.names.string(node)
                consts = [v.value if isinstance(v, ast.Constant) else " 0 " for v in node.values]
                parts.append((text if text is not None else "".join(map(str, consts)), node.lineno))
            elif self.is_composite(node):
                text = self.names.string(node)
                if text is not None:
                    composites.append((text, node.lineno))
        seen: set[tuple[str, str]] = set()
        for text, line in parts:
            seen |= self.scan_string(text, line, set())
        for text, line in composites:
            self.scan_string(text, line, seen)

    def scan_decoys(self) -> None:
        """Kernels nobody launches: __global__ functions named once, @triton.jit functions never referenced,
        load_inline functions never called."""
        for name, line in self.cpp_kernels:
            if self.cpp_ids[name] <= 1:
                self.hit("KBV-S710", f"__global__ {name}", line, "cuda")
        loads = {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        attrs = {n.attr for n in ast.walk(self.tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in loads and any(
                    (self.names.qual(d.func if isinstance(d, ast.Call) else d) or "") == "triton.jit"
                    for d in node.decorator_list):
                self.hit("KBV-S710", f"@triton.jit {node.name}", node.lineno)
            elif isinstance(node, ast.Call) and (self.names.qual(node.func) or "").startswith(
                    "torch.utils.cpp_extension.load"):
                listed = _keyword(node, "functions")
                for fn in getattr(listed, "elts", []):
                    name = self.names.string(fn)
                    if name is not None and name not in attrs:
                        self.hit("KBV-S710", f"load_inline function {name!r}", fn.lineno)

    def is_composite(self, node: ast.AST) -> bool:
        """The outermost node of a concatenation or join of known strings."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            parent = self.parents.get(node)
            return not (isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Add))
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"

    def scan_string(self, text: str, line: int, skip: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Scan one string; hits whose (rule, evidence) is in `skip` are dropped. Returns what it hit."""
        if _looks_like_cpp(text):
            self.has_kernel = True
            source = "cuda" if any(m in text for m in _CUDA_MARKERS) else "cpp"
            toks = cpp_tokens(text)
            if not skip:  # a literal, not a concatenation of literals already seen
                self.cpp_ids.update(t.split("::")[-1] for kind, t, _ in toks if kind == "id")
                self.cpp_kernels += [(name, line + k - 1) for name, k in cpp_kernels(toks)]
            hits = [(r, e, line + k - 1, f" [{source} string at line {line}, line {k} within]")
                    for r, e, k in _cpp_hits(toks)]
        else:
            source = "python"
            hits = [(r, e, line, "") for r, e in _python_string_hits(text)]
        done: set[tuple[str, str]] = set()
        for rule_id, evidence, at, where in hits:
            if (rule_id, evidence) not in skip:
                self.hit(rule_id, evidence, at, source, where)
                done.add((rule_id, evidence))
        return done


def _is_low_precision(qual: str) -> bool:
    last = qual.rsplit(".", 1)[-1]
    if qual.startswith(("torch.autocast", "torch.cuda.amp.autocast", "torch.amp.autocast", "torch.cpu.amp.autocast")):
        return True
    return qual.startswith(("torch.", "triton.language.")) and qual.count(".") <= 2 and (
        last in _LOW_DTYPES or last.startswith("float8"))
