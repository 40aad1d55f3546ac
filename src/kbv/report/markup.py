"""HTML as strings, escaped in one place: text is always escaped; markup is only what these build."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

Markup = str  # already-escaped HTML


def text(value: object) -> Markup:
    """`value` as escaped text (None as empty)."""
    return "" if value is None else html.escape(str(value), quote=True)


def element(tag: str, *children: Markup, **attrs: object) -> Markup:
    """`<tag attrs>children</tag>`; attribute names lose a trailing `_` (`class_`), `_` becomes `-`;
    a False or None attribute is left out, True is written bare."""
    parts = [tag]
    for name, value in attrs.items():
        if value is None or value is False:
            continue
        name = name.rstrip("_").replace("_", "-")
        parts.append(name if value is True else f'{name}="{text(value)}"')
    return f"<{' '.join(parts)}>{''.join(children)}</{tag}>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Markup]], **attrs: object) -> Markup:
    """A plain table: escaped headers, cells given as markup (wrap text with `text`)."""
    head = element("thead", element("tr", *(element("th", text(h), scope="col") for h in headers)))
    body = element("tbody", *(element("tr", *(element("td", cell) for cell in row)) for row in rows))
    return element("table", head, body, **attrs)


def definition_list(items: Iterable[tuple[str, Markup]]) -> Markup:
    return element("dl", *(element("dt", text(k)) + element("dd", v) for k, v in items))
