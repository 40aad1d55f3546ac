"""Attribution: which kernels ran in one forward, and whether they are the candidate's own.

The child profiles one forward (`kbv.sandbox.profiling`) and counts launches of the candidate's
extension functions and Triton kernels (its guards). Here, in the parent (`attribute`): a kernel is the candidate's own when its name carries one of the kernel
names the candidate's source defines (`__global__` functions, `@triton.jit` functions), or when it
was launched by one of the candidate's extension functions and is not a library kernel. The custom
share is the candidate's kernels' share of device time (of wall time on CPU).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kbv.verdict import Category

_LIBRARY = re.compile(r"(^|[^a-z])(at::native|cublas|cudnn|cutlass_\d|sm\d+_xmma|xmma_|ampere_|volta_|turing_|"
                      r"hopper_|gemv|gemm|splitk|memcpy|memset|elementwise_kernel|reduce_kernel|"
                      r"triton_(poi|red|per|tem)_|cudaMemcpy|nvjet)", re.IGNORECASE)
_TRITON_DEF = re.compile(r"@\s*triton\.jit[^\n]*\n(?:\s*@[^\n]*\n)*\s*def\s+([A-Za-z_]\w*)")


def kernel_names(source: str) -> list[str]:
    """Names of the kernels a candidate's source defines (CUDA `__global__` and Triton `@triton.jit`)."""
    from kbv.scan.cpp import cpp_kernels, cpp_tokens

    cuda = {name for name, _ in cpp_kernels(cpp_tokens(source))} if "__global__" in source else set()
    return sorted(cuda | set(_TRITON_DEF.findall(source)))


@dataclass(frozen=True)
class Attribution:
    custom_launches: int
    custom_share: float  # of device time (GPU) or wall time (CPU), 0..1
    kernels: tuple[tuple[str, float, bool], ...] = ()  # (name, us, custom)
    launches: dict[str, int] = field(default_factory=dict)
    ghost: str = ""  # the output with the candidate's launches suppressed: unchanged | changed | raised...
    seconds: dict[str, float] = field(default_factory=dict)  # where the stage's wall time went

    @property
    def decoy(self) -> bool:
        """Its own kernels ran but the output does not depend on them."""
        return self.custom_launches > 0 and self.ghost == "unchanged"


def attribute(reply: dict[str, Any], source: str, device_type: str) -> Attribution:
    """Classify a child's attribution reply against the candidate's source."""
    launches = {k: int(v) for k, v in reply.get("launches", {}).items()}
    custom_launches = sum(launches.values())
    ghost = str(reply.get("ghost", ""))
    profiled = any(not k.get("error") for k in reply.get("kernels", []))
    if device_type != "cuda" or not profiled:  # a CPU, or no profile: launch counts and their time decide
        wall_s = max(float(reply.get("wall_ms", 0.0)) / 1e3, 1e-9)
        share = min(sum(float(v) for v in reply.get("launch_s", {}).values()) / wall_s, 1.0)
        return Attribution(custom_launches, share if custom_launches else 0.0, (), launches, ghost,
                           dict(reply.get("seconds", {})))
    names = kernel_names(source)
    rows = []
    for k in reply.get("kernels", []):
        if k.get("error"):
            continue
        name = str(k["name"])
        own = any(n in name for n in names) or (custom_launches > 0 and not _LIBRARY.search(name) and
                                                  not name.startswith(("Memcpy", "Memset")))
        rows.append((name[:200], float(k["us"]), own))
    total = sum(us for _, us, _ in rows)
    custom = sum(us for _, us, own in rows if own)
    share = custom / total if total > 0 else 0.0
    if not any(own for *_, own in rows):
        custom_launches = 0  # counters fired, but no device kernel of the candidate's ran
    return Attribution(custom_launches, share, tuple(rows), launches, ghost, dict(reply.get("seconds", {})))


def missing_custom_work(a: Attribution, min_custom_share: float) -> tuple[Category, str] | None:
    """What the attribution lacks for a verified verdict (category, why), or None: own kernels that
    are decoys, no own kernel at all, or a share of the time under `min_custom_share`."""
    if a.decoy:
        return (Category.NO_CUSTOM_KERNEL,
                "the candidate's own kernels ran, but with them suppressed the output is unchanged: decoys")
    if a.custom_launches == 0:
        return (Category.NO_CUSTOM_KERNEL,
                "no kernel of the candidate's own ran: the work was done by library code "
                f"({len(a.kernels)} device kernels, none the candidate's)" if a.kernels else
                "no kernel of the candidate's own ran (no extension function or Triton kernel was launched)")
    if a.custom_share < min_custom_share:
        return (Category.LOW_CUSTOM_SHARE,
                f"the candidate's own kernels took {100 * a.custom_share:.0f}% of the time, "
                f"below the required {100 * min_custom_share:.0f}%")
    return None
