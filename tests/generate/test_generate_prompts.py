"""Templates and their rendering (kbv.generate.prompts)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from chat_server import DOUBLE

from kbv.errors import UsageError
from kbv.generate.extract import fenced_blocks
from kbv.generate.prompts import (Backend, builtin_template, check_template, load_template, prompt_hash,
                                  read_template, render_prompt, strip_directives)
from kbv.problems import make_problem


def double_problem():
    return make_problem("1_Double", DOUBLE, origin="test", level=1)


@pytest.mark.parametrize("backend", list(Backend))
def test_builtin_templates_are_valid(backend):
    template = builtin_template(backend)
    check_template(template.text, template.origin)
    assert template.origin == f"builtin:{backend.value}"


@pytest.mark.parametrize("backend", list(Backend))
def test_builtin_template_has_one_worked_example(backend):
    blocks = fenced_blocks(builtin_template(backend).text)
    reference, answer, task = blocks
    assert "class Model(" in reference.code and "def get_inputs" in reference.code
    assert answer.defines_model_new and "class Model(" not in answer.code
    assert task.code.strip() == "$problem_source"
    ast.parse(reference.code)
    ast.parse(answer.code)
    if backend is Backend.CUDA:
        assert "load_inline" in answer.code and "__global__" in answer.code
    else:
        assert "@triton.jit" in answer.code


def test_worked_example_reference_runs():
    reference = fenced_blocks(builtin_template(Backend.CUDA).text)[0].code
    namespace: dict = {}
    exec(compile(reference.replace("4096", "8").replace("8192", "16"), "example", "exec"), namespace)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    (x,) = namespace["get_inputs"]()
    assert torch.equal(model(x), torch.relu(x * 0.5 - 0.25))


def test_render_includes_the_source_without_directives():
    prompt = render_prompt(builtin_template(Backend.CUDA), double_problem())
    task = fenced_blocks(prompt)[-1].code
    assert "class Model(nn.Module)" in task and "return x * 2" in task
    assert "batch_size = 4096\n" in task
    assert "kbv" not in prompt.lower()  # no harness metadata in what the model sees
    assert "$" not in prompt


def test_render_is_a_function_of_template_and_source():
    template = builtin_template(Backend.TRITON)
    a = render_prompt(template, double_problem())
    b = render_prompt(template, make_problem("1_Double", DOUBLE, origin="elsewhere", level=1))
    assert a == b and prompt_hash(a) == prompt_hash(b)
    assert prompt_hash(a) != prompt_hash(render_prompt(builtin_template(Backend.CUDA), double_problem()))


def test_strip_directives():
    code = "n = 4096  # kbv: smoke=8\n# kbv: domain=positive\nm = 3  # a note\ns = '# kbv: in a string'\n"
    assert strip_directives(code) == "n = 4096\nm = 3  # a note\ns = '# kbv: in a string'\n"
    assert strip_directives("x = 1\n") == "x = 1\n"


def test_custom_template(tmp_path: Path):
    path = tmp_path / "mine.txt"
    path.write_text("Make $problem_name faster; it costs $$0.\n```python\n${problem_source}\n```\n")
    template = load_template(Backend.CUDA, path)
    prompt = render_prompt(template, double_problem())
    assert prompt.startswith("Make 1_Double faster; it costs $0.")
    assert "return x * 2" in prompt


@pytest.mark.parametrize("text, message", [
    ("$problem_sauce", "Did you mean $problem_source"),  # an unknown name, with a suggestion
    ("cost: $ 5 $problem_source", "bare '$'"),
    ("no placeholder at all", "never uses $problem_source"),
])
def test_malformed_templates(text, message):
    with pytest.raises(UsageError, match=message.replace("$", r"\$")):
        check_template(text, "mine.txt")


def test_unreadable_template(tmp_path: Path):
    with pytest.raises(UsageError, match="Cannot read prompt template"):
        read_template(tmp_path / "missing.txt")
