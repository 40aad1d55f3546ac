"""Which fenced block of a reply is the candidate (kbv.generate.extract)."""

from __future__ import annotations

from kbv.generate.extract import defines_model_new, extract_model_new, fenced_blocks

GOOD = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
BETTER = GOOD.replace("return x", "return x.clone()")


def fence(code: str, tag: str = "python", mark: str = "```") -> str:
    return f"{mark}{tag}\n{code}{mark}\n"


def test_single_python_block():
    assert extract_model_new("Sure!\n\n" + fence(GOOD) + "\nThis fuses everything.") == GOOD


def test_untagged_block_counts_as_python():
    assert extract_model_new(fence(GOOD, tag="")) == GOOD


def test_tag_variants_and_info_strings():
    for tag in ("Python", "py", "python3", "PY3", "python title=model_new.py"):
        assert extract_model_new(fence(GOOD, tag=tag)) == GOOD, tag


def test_prose_without_code_is_none():
    assert extract_model_new("I cannot write a faster kernel than cuBLAS for this.") is None
    assert extract_model_new("") is None


def test_block_without_model_new_is_none():
    assert extract_model_new(fence("def helper():\n    return 1\n")) is None


def test_usage_example_is_not_a_definition():
    reply = fence(GOOD) + "Use it like this:\n" + fence("model = ModelNew()\nprint(model(x))\n")
    assert extract_model_new(reply) == GOOD


def test_last_defining_block_wins():
    reply = "First try:\n" + fence(GOOD) + "Refined:\n" + fence(BETTER) + "Done."
    assert extract_model_new(reply) == BETTER


def test_cpp_block_before_python_block():
    # KernelBench's first-block rule breaks here; ours takes the Python module
    reply = fence("__global__ void k(float* x) {}\n", tag="cpp") + fence(GOOD)
    assert extract_model_new(reply) == GOOD


def test_python_tagged_preferred_over_later_other_tag():
    reply = fence(GOOD) + fence("class ModelNew : public Base {};\n", tag="cpp")
    assert extract_model_new(reply) == GOOD


def test_mislabelled_block_is_the_fallback():
    assert extract_model_new(fence(GOOD, tag="cuda")) == GOOD


def test_unterminated_final_fence_runs_to_the_end():
    reply = "Here:\n```python\n" + GOOD + "\n\n"
    blocks = fenced_blocks(reply)
    assert len(blocks) == 1 and not blocks[0].terminated
    assert extract_model_new(reply) == GOOD


def test_tilde_fences():
    assert extract_model_new(fence(GOOD, mark="~~~")) == GOOD


def test_tilde_fence_not_closed_by_backticks():
    code = GOOD + "s = '''\n```\n'''\n"
    assert extract_model_new(fence(code, mark="~~~")) == code


def test_longer_fence_holds_shorter_ones():
    code = GOOD + 'DOC = """\n```\nexample\n```\n"""\n'
    assert extract_model_new(fence(code, mark="````")) == code


def test_crlf_and_lone_cr():
    crlf = fence(GOOD).replace("\n", "\r\n")
    assert extract_model_new("Sure\r\n" + crlf) == GOOD
    assert extract_model_new(fence(GOOD).replace("\n", "\r")) == GOOD


def test_indented_fence_is_dedented():
    indented = "1. Write the module:\n\n" + "".join("   " + line + "\n" for line in fence(GOOD).splitlines())
    assert extract_model_new(indented) == GOOD


def test_closing_fence_may_carry_trailing_spaces():
    assert extract_model_new("```python\n" + GOOD + "```   \nafter") == GOOD


def test_inline_triple_backticks_are_not_a_fence():
    reply = "Reply with one ```python``` block.\n" + fence(GOOD)
    assert len(fenced_blocks(reply)) == 1
    assert extract_model_new(reply) == GOOD


def test_blank_lines_around_the_code_are_trimmed():
    assert extract_model_new("```python\n\n\n" + GOOD + "\n\n```") == GOOD


def test_defines_model_new():
    assert defines_model_new("class ModelNew(nn.Module):\n    pass\n")
    assert defines_model_new("if True:\n    class ModelNew:\n        pass\n")
    assert not defines_model_new("class ModelNewer:\n    pass\n")
    assert not defines_model_new("x = ModelNew()\n")
