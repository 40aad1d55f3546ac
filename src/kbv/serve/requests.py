"""What a client sends, parsed and checked: pure functions of the request body and the `Limits`.

    POST /v1/evaluate         {"problem": "L1/2_ReLU", "code": "<ModelNew source>", "protocol": "verified"}
    POST /v1/evaluate_batch   {"items": [<the same>, ...]}

`problem` and `code` are required strings; `protocol` is `standard`, `verified` (the default) or
`both`. Any other field is refused, so that a misspelt one is not silently ignored. Every refusal is a
ServiceError with its HTTP status: 400 malformed (not JSON, not an object, a field missing or of the
wrong type), 413 too large (a body, a batch or one item's code over its limit).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kbv.errors import ServiceError, first_line

PROTOCOLS = ("standard", "verified", "both")
DEFAULT_PROTOCOL = "verified"
_FIELDS = ("problem", "code", "protocol")


@dataclass(frozen=True)
class Limits:
    """What the service takes. Sizes in bytes; `max_queue` counts pairs waiting or evaluating."""

    max_code_bytes: int = 1 << 20  # one item's code, UTF-8 encoded
    max_batch: int = 1024  # items in one /v1/evaluate_batch
    max_queue: int = 4096  # pairs admitted and not yet answered (cached answers take no room)
    max_body_bytes: int = 64 << 20  # one request's body

    def to_dict(self) -> dict[str, int]:
        return {"max_code_bytes": self.max_code_bytes, "max_batch": self.max_batch,
                "max_queue": self.max_queue, "max_body_bytes": self.max_body_bytes}


@dataclass(frozen=True)
class Item:
    """One evaluation asked for; `problem` as the client named it (resolved by the service)."""

    problem: str
    code: str
    protocol: str = DEFAULT_PROTOCOL

    @property
    def protocols(self) -> tuple[str, ...]:
        return ("standard", "verified") if self.protocol == "both" else (self.protocol,)


def parse_evaluate(body: bytes, limits: Limits) -> Item:
    """The item of a /v1/evaluate body."""
    return parse_item(_json_object(body), limits)


def parse_batch(body: bytes, limits: Limits) -> list[Item]:
    """The items of a /v1/evaluate_batch body, in order."""
    data = _json_object(body)
    extra = sorted(set(data) - {"items"})
    if extra:
        raise ServiceError(400, f"unknown field '{extra[0]}': a batch is {{\"items\": [...]}}")
    items = data.get("items")
    if not isinstance(items, list):
        raise ServiceError(400, "missing field 'items': a batch is {\"items\": [{\"problem\", \"code\", \"protocol\"}, ...]}")
    if not items:
        raise ServiceError(400, "'items' is empty")
    if len(items) > limits.max_batch:
        raise ServiceError(413, f"a batch of {len(items)} items is over the limit of {limits.max_batch}: split it")
    return [parse_item(item, limits, f"items[{i}]: ") for i, item in enumerate(items)]


def parse_item(data: Any, limits: Limits, where: str = "") -> Item:
    """One item; `where` prefixes every message ("items[3]: ")."""
    if not isinstance(data, dict):
        raise ServiceError(400, f"{where}expected a JSON object with 'problem' and 'code'")
    extra = sorted(set(data) - set(_FIELDS))
    if extra:
        raise ServiceError(400, f"{where}unknown field '{extra[0]}' (the fields are problem, code, protocol)")
    for name in ("problem", "code"):
        if name not in data:
            raise ServiceError(400, f"{where}missing field '{name}'")
        if not isinstance(data[name], str):
            raise ServiceError(400, f"{where}'{name}' must be a string, not {_json_type(data[name])}")
    protocol = data.get("protocol", DEFAULT_PROTOCOL)
    if protocol not in PROTOCOLS:
        raise ServiceError(400, f"{where}unknown protocol {json.dumps(protocol)[:40]}: expected standard, verified or both")
    try:
        size = len(data["code"].encode("utf-8"))
        data["problem"].encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800"): JSON allows it, a source file cannot hold it
        raise ServiceError(400, f"{where}'problem' and 'code' must be valid Unicode (no lone surrogates)") from None
    if size > limits.max_code_bytes:
        raise ServiceError(413, f"{where}the code is {size} bytes, over the limit of {limits.max_code_bytes}")
    if not data["problem"].strip():
        raise ServiceError(400, f"{where}'problem' is empty")
    return Item(data["problem"], data["code"], protocol)


def _json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise ServiceError(400, "the request has no body: send JSON")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, or nested past the parser's depth
        raise ServiceError(400, f"malformed JSON: {first_line(exc, 200)}") from None
    if not isinstance(data, dict):
        raise ServiceError(400, f"expected a JSON object, not {_json_type(data)}")
    return data


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
