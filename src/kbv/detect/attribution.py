"""Attribution: which kernels ran in one forward, and whether they are the candidate's own.

The child profiles one forward (`kbv.sandbox.profiling`), counts launches of the candidate's
extension functions and Triton kernels (its guards), and names the kernels that come from the
candidate's own code (`kbv.sandbox.own_kernels`): those its shared objects define (PTX embedded in
them included) and those its Triton functions compiled. Here, in the parent (`attribute`), a
profiled kernel is the candidate's own when its name is one of those; every other kernel (ATen,
cuBLAS, cuDNN, Inductor's, one no list has heard of) is not, whatever it is called. The candidate's
source text names nothing: a comment or a string there says what it likes, and a module it loads
from PTX text of its own at run time (`cuModuleLoadData`) is one nothing here sees loaded, so its
kernels are not credited. Where the child could not name them, or nothing was profiled, launch
counts and their time decide. The custom share is the candidate's kernels' share of device time (of
wall time on CPU).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kbv.verdict import Category

def own_names(names: Iterable[str]) -> frozenset[str]:
    """Kernel names as the profiler shows them: each name as given and demangled the way the
    profiler demangles (names of one character stay as they are), spaces normalised."""
    return frozenset(_normal(v) for n in names for v in (n, _demangle(n)))


def _demangle(name: str) -> str:
    import torch

    try:
        return torch._C._demangle(name) if len(name) > 1 else name
    except Exception:  # a name the demangler rejects stays as it is, in the profile too
        return name


def _normal(name: str) -> str:
    return " ".join(name.split())


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


def attribute(reply: dict[str, Any], device_type: str) -> Attribution:
    """Classify a child's attribution reply: `kernels` (profiled device kernels), `own_kernels` (the
    names of the candidate's own, from the child), launch counts and times. Raises TypeError on a
    malformed `own_kernels`."""
    launches = {k: int(v) for k, v in reply.get("launches", {}).items()}
    custom_launches = sum(launches.values())
    ghost = str(reply.get("ghost", ""))
    profiled = any(not k.get("error") for k in reply.get("kernels", []))
    named = "own_kernels" in reply  # absent: the child could not name the candidate's kernels
    if device_type != "cuda" or not profiled or not named:  # launch counts and their time decide
        wall_s = max(float(reply.get("wall_ms", 0.0)) / 1e3, 1e-9)
        share = min(sum(float(v) for v in reply.get("launch_s", {}).values()) / wall_s, 1.0)
        return Attribution(custom_launches, share if custom_launches else 0.0, (), launches, ghost,
                           dict(reply.get("seconds", {})))
    given = reply["own_kernels"]
    if not isinstance(given, list) or not all(isinstance(n, str) for n in given):
        raise TypeError("own_kernels is not a list of kernel names")
    names = own_names(given)
    rows = []
    for k in reply.get("kernels", []):
        if k.get("error"):
            continue
        name = str(k["name"])
        rows.append((name[:200], float(k["us"]), _normal(name) in names))
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
