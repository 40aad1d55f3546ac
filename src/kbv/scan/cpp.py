"""String contents: whether a string is C++/CUDA source, the rules over a plain Python literal, and
for C++/CUDA a tokenizer and the rules over its tokens.

C++/CUDA is tokenized with comments dropped and matched by identifier (`a::b::c` merged into one);
string literals inside it are searched only for inline-PTX precision suffixes and /proc paths. Lines are
within the source, from 1.
"""

from __future__ import annotations

import re

from kbv.scan.rules import _HEAVY


def _looks_like_cpp(text: str) -> bool:
    return any(m in text for m in ("__global__", "#include", "torch::", "at::", "__device__")) or (
        "{" in text and "}" in text and ";" in text)


_CUDA_MARKERS = ("__global__", "__device__", "__shared__", "<<<", "cuda_runtime", "cuda.h", "ATen/cuda")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*\Z")


def _python_string_hits(text: str) -> list[tuple[str, str]]:
    """Telling Python literals: compiler flags, /proc paths, and C API names looked up by string (ctypes)."""
    hits = []
    checks = (("/proc/self/", "KBV-S805"), ("default-stream", "KBV-S101"), ("use_fast_math", "KBV-S607"),
              ("ffast-math", "KBV-S607"), ("pip install", "KBV-S809"), ("pip3 install", "KBV-S809"))
    hits += [(rule, repr(needle)) for needle, rule in checks if needle in text]
    if _IDENTIFIER.match(text):
        rule = _cpp_identifier_rule(text, "", "")
        if rule is not None:
            hits.append((rule, repr(text)))
    return hits


# ---- embedded C++/CUDA ----------------------------------------------------------------------------

_CPP_NAMES: dict[str, str] = {
    **dict.fromkeys(("cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority",
                     "cudaStreamNonBlocking", "cudaStreamPerThread", "getStreamFromPool", "getStreamFromExternal",
                     "setCurrentCUDAStream", "CUDAStreamGuard", "OptionalCUDAStreamGuard", "CUDAMultiStreamGuard",
                     "cudaEventDisableTiming", "cuStreamCreate", "hipStreamCreate", "hipStreamCreateWithFlags"),
                    "KBV-S102"),
    **dict.fromkeys(("pthread_create", "std::thread", "std::jthread", "std::async", "boost::thread"), "KBV-S202"),
    **dict.fromkeys(("cudaLaunchHostFunc", "cudaStreamAddCallback", "atexit"), "KBV-S203"),
    **dict.fromkeys((
        "__half", "__half2", "half2", "__nv_bfloat16", "__nv_bfloat162", "nv_bfloat16", "nv_bfloat162", "__float2half",
        "__float2half_rn", "__float2half_rz", "__half2float", "__floats2half2_rn", "__float22half2_rn",
        "__half22float2", "__float2bfloat16", "__float2bfloat16_rn", "__bfloat162float", "__hadd", "__hsub", "__hmul",
        "__hdiv", "__hfma", "__hadd2", "__hmul2", "__hfma2", "half_t", "bfloat16_t", "tfloat32_t", "__nv_fp8_e4m3",
        "__nv_fp8_e5m2", "__float_to_tf32", "wmma", "nvcuda", "kHalf", "kBFloat16", "kFloat16", "kFloat8_e4m3fn",
        "kFloat8_e5m2", "CUBLAS_TF32_TENSOR_OP_MATH", "CUBLAS_TENSOR_OP_MATH", "CUBLAS_COMPUTE_32F_FAST_TF32",
        "CUBLAS_COMPUTE_32F_FAST_16F", "CUBLAS_COMPUTE_32F_FAST_16BF", "CUBLAS_COMPUTE_16F", "CUDA_R_16F",
        "CUDA_R_16BF", "CUDNN_DATA_HALF", "CUDNN_DATA_BFLOAT16", "CUDNN_TENSOR_OP_MATH",
        "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION"), "KBV-S606"),
    **dict.fromkeys(("__expf", "__exp10f", "__logf", "__log2f", "__log10f", "__sinf", "__cosf", "__tanf", "__sincosf",
                     "__powf", "__fdividef"), "KBV-S607"),
    **dict.fromkeys(("dlopen", "dlsym"), "KBV-S804"),
    **dict.fromkeys(("mprotect", "ptrace", "process_vm_writev", "process_vm_readv", "cuMemGetAddressRange"),
                    "KBV-S805"),
    **dict.fromkeys(("fopen", "freopen", "ofstream", "fstream", "creat", "unlink"), "KBV-S806"),
    "dup2": "KBV-S807",
    **dict.fromkeys(("socket", "gethostbyname", "getaddrinfo", "curl_easy_init"), "KBV-S808"),
    **dict.fromkeys(("system", "popen"), "KBV-S809"),
    **dict.fromkeys(("fork", "vfork", "execv", "execve", "execvp", "execvpe", "execl", "execlp", "execle", "_exit",
                     "_Exit", "quick_exit", "kill"), "KBV-S810"),
    **dict.fromkeys(("exit", "abort"), "KBV-S811"),
    **dict.fromkeys(("cudaLimitPersistingL2CacheSize", "accessPolicyWindow", "hitProp", "missProp", "hitRatio",
                     "cudaAccessPropertyPersisting", "cudaAccessPolicyWindow", "cudaStreamAttributeAccessPolicyWindow",
                     "cudaLaunchAttributeAccessPolicyWindow", "cudaKernelNodeAttributeAccessPolicyWindow",
                     "cudaCtxResetPersistingL2Cache", "persistingL2CacheMaxSize"), "KBV-S901"),
    **dict.fromkeys(("cudaGraphLaunch", "cudaGraphInstantiate", "cudaGraphInstantiateWithFlags",
                     "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphExecUpdate", "CUDAGraph"), "KBV-S902"),
}
# Common words: only a call, and not a member call, counts (`x.kill()`, `int socket;` do not).
_CALL_ONLY = frozenset({"socket", "system", "popen", "fork", "_exit", "kill", "exit", "abort", "atexit", "unlink",
                        "creat", "dup2"})
# at::/torch:: calls that allocate, describe, guard or schedule: not library compute.
_ATEN_HELPERS = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "arange",
    "tensor", "from_blob", "scalar_tensor", "rand", "randn", "randint", "TensorOptions", "Tensor", "Scalar", "Device",
    "dtype", "device", "IntArrayRef", "ArrayRef", "getCurrentCUDAStream", "getDefaultCUDAStream", "CUDAGuard",
    "OptionalCUDAGuard", "device_of", "parallel_for", "get_num_threads", "globalContext", "getCurrentDeviceProperties",
    "getDeviceProperties", "elementSize", "isFloatingType", "toString", "Slice", "TensorArg", "checkAllSameGPU",
    "ScalarType", "MemoryFormat", "Layout", "make_optional", "nullopt", "check", "current_device", "device_count",
})
_CPP_TOKEN = re.compile(r"""
    (?P<ws>\s+) | (?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))
  | (?P<raw>(?:u8|[uUL])?R"(?P<delim>[^()\\\s]{0,16})\(.*?\)(?P=delim)")
  | (?P<str>(?:u8|[uUL])?"(?:\\.|[^"\\\n])*"?) | (?P<chr>'(?:\\.|[^'\\\n])*'?)
  | (?P<num>\.?\d(?:[\w.']|[eEpP][+-])*) | (?P<id>[A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*)
  | (?P<op><<<|>>>|::|\#\#|->|==|!=|.)
""", re.VERBOSE | re.DOTALL)
_PTX_LOW = re.compile(r"\.(?:f16x2|f16|bf16x2|bf16|tf32|e4m3|e5m2)\b")


def cpp_tokens(src: str) -> list[tuple[str, str, int]]:
    """(kind, text, line) of C++ source, comments dropped; kinds: id (a::b::c merged), str, num, op. Lines from 1."""
    out: list[tuple[str, str, int]] = []
    line = 1
    for m in _CPP_TOKEN.finditer(src):
        kind, text = m.lastgroup, m.group()
        if kind == "raw" or kind == "delim":
            kind = "str"
            text = text[text.index("(") + 1: text.rindex(")")]
        elif kind == "str":
            text = text[text.index('"') + 1:].removesuffix('"')
        if kind in ("id", "str", "op", "num"):
            out.append((kind, re.sub(r"\s+", "", text) if kind == "id" else text, line))
        line += m.group().count("\n")
    return out


def scan_cpp(src: str) -> list[tuple[str, str, int]]:
    """(rule id, evidence, line within `src`) for one C++/CUDA source; comments and string literals are stripped,
    except that strings are searched for inline-PTX precision suffixes and /proc paths."""
    return _cpp_hits(cpp_tokens(src))


def _cpp_hits(toks: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    hits = _cpp_token_hits(toks)
    statics = [h for h in hits if h[0] == "KBV-S509"]
    for k, (kind, text, line) in enumerate(toks):
        if kind == "op" and text in ("==", "!=") and _compares_pointer(toks, k):
            # a pointer match next to tensors kept in static storage is a replay cache
            hits.append(("KBV-S501" if statics else "KBV-S502", f"data_ptr() {text}", line))
    return hits


def _compares_pointer(toks: list[tuple[str, str, int]], k: int) -> bool:
    """`x.data_ptr() == last` (not a null or alignment check such as `... % 16 == 0`)."""
    def is_null(t: tuple[str, str, int]) -> bool:
        return t[0] == "num" or t[1] in ("nullptr", "NULL")
    left = [t[1] for t in toks[max(0, k - 6):k]]
    right = [t[1] for t in toks[k + 1:k + 5]]
    if "data_ptr" in left and k + 1 < len(toks):
        return not is_null(toks[k + 1])
    return "data_ptr" in right and k > 0 and not is_null(toks[k - 1])


def _static_state(toks: list[tuple[str, str, int]], k: int) -> str | None:
    """The type of a `static` variable declared at toks[k] when it holds tensors, else None (functions too)."""
    decl = []
    for _, text, _ in toks[k + 1:k + 40]:
        if text in (";", "=", "{", "("):
            if text == "(":
                return None
            break
        decl.append(text)
    held = [t for t in decl if t.split("::")[-1] in ("Tensor", "unordered_map", "map", "TensorList")]
    return held[0] if held else None


def _cpp_token_hits(toks: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    hits: list[tuple[str, str, int]] = []
    for k, (kind, text, line) in enumerate(toks):
        prev = toks[k - 1][1] if k else ""
        nxt = toks[k + 1][1] if k + 1 < len(toks) else ""
        if kind == "op" and text == "##":
            hits.append(("KBV-S103", "##", line))
        elif kind == "str":
            ptx = _PTX_LOW.search(text)
            if ptx:
                hits.append(("KBV-S606", f"PTX {ptx.group()}", line))
            if "/proc/self/" in text:
                hits.append(("KBV-S805", repr(text[:40]), line))
        elif kind == "id" and text == "static" and (held := _static_state(toks, k)):
            hits.append(("KBV-S509", f"static {held}", line))
        elif kind == "id":
            rule = _cpp_identifier_rule(text, prev, nxt)
            if rule is not None:
                hits.append((rule, text, line))
    return hits


def cpp_kernels(toks: list[tuple[str, str, int]]) -> list[tuple[str, int]]:
    """(name, line) of each __global__ function defined or declared in the tokens."""
    out = []
    for k, (_, text, _) in enumerate(toks):
        if text != "__global__":
            continue
        for j in range(k + 1, min(k + 16, len(toks) - 1)):  # past template args, qualifiers, launch bounds
            kind, name, line = toks[j]
            if kind == "id" and toks[j + 1][1] == "(" and name != "__launch_bounds__":
                out.append((name, line))
                break
    return out


def _cpp_identifier_rule(text: str, prev: str, nxt: str) -> str | None:
    parts = text.split("::")
    last = parts[-1]
    if prev in (".", "->"):  # a member: only tensor methods that are library compute
        return "KBV-S706" if last in _HEAVY and nxt == "(" else None
    if "::" in text.strip(":") and text.strip(":") in _CPP_NAMES:  # std::thread, std::async
        return _CPP_NAMES[text.strip(":")]
    if last in _CPP_NAMES:
        if last in _CALL_ONLY and nxt != "(":
            return None
        return _CPP_NAMES[last]
    if "wmma" in parts or "nvcuda" in parts:
        return "KBV-S606"
    if last in ("Half", "BFloat16") and len(parts) > 1 and parts[-2] != "ScalarType":
        return "KBV-S606"
    if parts[0] in ("at", "torch") and len(parts) > 1 and nxt == "(" and last not in _ATEN_HELPERS:
        return "KBV-S706"
    if last.startswith(("cublas", "cudnn")):
        return "KBV-S706"
    return None
