"""Request bodies, parsed and checked: every refusal is a ServiceError with its status and one line."""

from __future__ import annotations

import json

import pytest

from kbv.errors import ServiceError
from kbv.serve.requests import Item, Limits, parse_batch, parse_evaluate


def _body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_an_item_with_its_defaults():
    item = parse_evaluate(_body({"problem": "L1/2_ReLU", "code": "x = 1\n"}), Limits())
    assert item == Item("L1/2_ReLU", "x = 1\n", "verified") and item.protocols == ("verified",)
    assert parse_evaluate(_body({"problem": "p", "code": "", "protocol": "both"}), Limits()).protocols == (
        "standard", "verified")


@pytest.mark.parametrize("body, status, message", [
    (b"", 400, "the request has no body"),
    (b"{\"problem\": ", 400, "malformed JSON"),
    (b"\xff\xfe\x00", 400, "malformed JSON"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "malformed JSON"),  # nested past the parser's depth
    (_body([1, 2]), 400, "expected a JSON object, not an array"),
    (_body({"code": "x"}), 400, "missing field 'problem'"),
    (_body({"problem": "p"}), 400, "missing field 'code'"),
    (_body({"problem": "p", "code": None}), 400, "'code' must be a string, not null"),
    (_body({"problem": 3, "code": "x"}), 400, "'problem' must be a string, not a number"),
    (_body({"problem": "p", "code": "x", "protocl": "both"}), 400, "unknown field 'protocl'"),
    (_body({"problem": "p", "code": "x", "protocol": "fast"}), 400, "unknown protocol \"fast\""),
    (_body({"problem": " ", "code": "x"}), 400, "'problem' is empty"),
    (b'{"problem": "p", "code": "\\ud800"}', 400, "valid Unicode"),
    (_body({"problem": "p", "code": "é" * 6}), 413, "the code is 12 bytes, over the limit of 10"),
])
def test_a_bad_item_is_refused_with_its_status(body, status, message):
    with pytest.raises(ServiceError) as refused:
        parse_evaluate(body, Limits(max_code_bytes=10))
    assert refused.value.status == status and message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_batch_keeps_its_order_and_names_the_item_it_refuses():
    items = [{"problem": f"p{i}", "code": "x"} for i in range(3)]
    assert [i.problem for i in parse_batch(_body({"items": items}), Limits())] == ["p0", "p1", "p2"]
    items[1] = {"problem": "p1"}
    with pytest.raises(ServiceError, match=r"^items\[1\]: missing field 'code'$"):
        parse_batch(_body({"items": items}), Limits())


@pytest.mark.parametrize("body, status, message", [
    (_body({"item": []}), 400, "unknown field 'item'"),
    (_body({}), 400, "missing field 'items'"),
    (_body({"items": []}), 400, "'items' is empty"),
    (_body({"items": [{"problem": "p", "code": "x"}] * 3}), 413, "a batch of 3 items is over the limit of 2"),
])
def test_a_bad_batch_is_refused_with_its_status(body, status, message):
    with pytest.raises(ServiceError) as refused:
        parse_batch(body, Limits(max_batch=2))
    assert refused.value.status == status and message in str(refused.value)
