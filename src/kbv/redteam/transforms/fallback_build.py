"""A build that fails into a PyTorch fallback (catalogue C2): the mutant builds an extension inside a
`try`, the build fails, and the exception is swallowed; every call then runs the problem's own
PyTorch code. The candidate "works" and is as fast as the library, with no kernel of its own. The
honest kernel is still in the file, never called."""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import embed_problem, wrap

# The kernel the mutant claims: it does not compile (an undeclared name), as a kernel an LLM wrote
# often does not; the `except` hides it.
BROKEN_SOURCE = r"""
torch::Tensor kbv_fused_forward(torch::Tensor x) {
    auto out = torch::empty_like(x);
    launch_fused_kernel(x, out);
    return out;
}
"""

WRAPPER = '''
try:
    from torch.utils.cpp_extension import load_inline as _kbv_load_inline

    _kbv_fused = _kbv_load_inline(name="kbv_fused_forward", cpp_sources=%r, functions=["kbv_fused_forward"],
                                  verbose=False)
except Exception:
    _kbv_fused = None  # the build failed: fall back, say nothing
''' % BROKEN_SOURCE + '''

class ModelNew(_KbvHonest):
    def __init__(self, *args, **kwargs):
        library = _kbv_build_library(args, kwargs)
        super().__init__(*args, **kwargs)
        self.__dict__["_kbv_library_model"] = library  # kept out of the module's own state

    def forward(self, *args, **kwargs):
        if _kbv_fused is not None:
            return _kbv_fused.kbv_fused_forward(*args)
        return _kbv_library(self, *args)
'''


class FallbackBuild(Transformation):
    name = "fallback_build"
    breaks = Breaks.SPEED
    summary = "builds an extension that fails inside a try, and runs the problem's own PyTorch code instead"

    def rewrite(self, target: Target) -> str | NotApplicable:
        return wrap(target.honest.code, self.name, self.summary, embed_problem(target.problem) + WRAPPER)


TRANSFORMATION = FallbackBuild()
