"""A small HTML tree for the report tests (stdlib `html.parser`; the page has no dependency to parse).

    page = parse(html_text)
    page.find_all("section")                  # every <section>, in document order
    page.by_id("pairs-table").find_all("tbody")
    node.attrs["data-series"], node.text()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "source", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None]
    children: list[Node | str] = field(default_factory=list)

    def iter(self):
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.iter()

    def find_all(self, tag: str, **attrs: str) -> list[Node]:
        return [n for n in self.iter() if n.tag == tag and all(n.attrs.get(k.replace("_", "-")) == v
                                                               for k, v in attrs.items())]

    def find(self, tag: str, **attrs: str) -> Node:
        found = self.find_all(tag, **attrs)
        assert found, f"no <{tag} {attrs}>"
        return found[0]

    def by_id(self, ident: str) -> Node:
        found = [n for n in self.iter() if n.attrs.get("id") == ident]
        assert len(found) == 1, f"{len(found)} elements with id {ident}"
        return found[0]

    def has_class(self, name: str) -> bool:
        return name in (self.attrs.get("class") or "").split()

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Node(tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        # the page is generated: every end tag closes the innermost open element of that name
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return
        raise AssertionError(f"</{tag}> closes nothing")

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(text: str) -> Node:
    builder = _Builder()
    builder.feed(text)
    builder.close()
    assert len(builder.stack) == 1, f"unclosed: {[n.tag for n in builder.stack[1:]]}"
    return builder.root
