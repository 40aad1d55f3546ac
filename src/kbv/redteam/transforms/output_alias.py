"""Aliased outputs (catalogue B11): every allocation of the honest code (`torch.empty_like`,
`torch.empty`, and their C++ forms) keeps its first buffer and hands the same one back on every later
call of the same shape: no allocation per call, and every output a call returns is overwritten by the
next call. A harness that compares each output before its next call sees nothing wrong; a caller
holding two outputs finds the first one changed."""

from __future__ import annotations

from kbv.redteam import Breaks, NotApplicable, Target, Transformation
from kbv.redteam.source import RewriteError, allocations, insert_cpp_helpers, replace_spans, wrap

PYTHON_HELPERS = '''
_kbv_kept_buffers = {}


def _kbv_kept_like(site, like, **kwargs):
    key = (site, tuple(like.shape), kwargs.get("dtype", like.dtype), str(kwargs.get("device", like.device)))
    if key not in _kbv_kept_buffers:
        _kbv_kept_buffers[key] = torch.empty_like(like, **kwargs)
    return _kbv_kept_buffers[key]


def _kbv_kept_empty(site, *args, **kwargs):
    key = (site, repr(args), repr(sorted(kwargs.items(), key=lambda kv: kv[0])))
    if key not in _kbv_kept_buffers:
        _kbv_kept_buffers[key] = torch.empty(*args, **kwargs)
    return _kbv_kept_buffers[key]


class ModelNew(_KbvHonest):
    """The honest candidate, whose outputs now live in buffers it keeps."""
'''

CPP_HELPERS = r'''
#include <map>
#include <vector>

static std::vector<int64_t> kbv_key(int site, at::IntArrayRef sizes, const at::TensorOptions& options) {
    std::vector<int64_t> key(sizes.begin(), sizes.end());
    key.push_back(site);
    key.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(options.dtype())));
    key.push_back(static_cast<int64_t>(options.device().type()));
    return key;
}

static torch::Tensor kbv_kept_empty(int site, at::IntArrayRef sizes, const at::TensorOptions& options) {
    static std::map<std::vector<int64_t>, torch::Tensor> kept;
    auto key = kbv_key(site, sizes, options);
    auto found = kept.find(key);
    if (found != kept.end()) return found->second;
    auto fresh = torch::empty(sizes, options);
    kept.emplace(key, fresh);
    return fresh;
}

static torch::Tensor kbv_kept_like(int site, const torch::Tensor& like) {
    return kbv_kept_empty(site, like.sizes(), like.options());
}
'''


class OutputAlias(Transformation):
    name = "output_alias"
    breaks = Breaks.TRUTH
    summary = "keeps every buffer it allocates and returns the same output storage on every call"

    def rewrite(self, target: Target) -> str | NotApplicable:
        code = target.honest.code
        sites = allocations(code)
        if not sites:
            return self.not_applicable("the source allocates no output with torch.empty or torch.empty_like")
        if any(s.language == "cpp" and s.fn == "empty_like" and "," in s.args for s in sites):
            return self.not_applicable("a C++ empty_like with options of its own is not rewritten")
        spans = []
        for index, site in enumerate(sites):
            helper = ("_kbv_kept_like" if site.fn == "empty_like" else "_kbv_kept_empty") if site.language == "python" \
                else ("kbv_kept_like" if site.fn == "empty_like" else "kbv_kept_empty")
            spans.append((site.start, site.end, f"{helper}({index}, {site.args})"))
        code = replace_spans(code, spans)
        if any(s.language == "cpp" for s in sites):
            try:
                code = insert_cpp_helpers(code, CPP_HELPERS)
            except RewriteError as exc:
                return self.not_applicable(str(exc))
        return wrap(code, self.name, self.summary, PYTHON_HELPERS)


TRANSFORMATION = OutputAlias()
