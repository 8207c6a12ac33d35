"""The report as one self-contained HTML page: the markdown report rendered by markdown-it, with its
figures inlined as data URIs and its style in the page, so it opens anywhere, offline, as one file."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from types import MappingProxyType

from markdown_it import MarkdownIt

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #1d1d1f; line-height: 1.45; }
h1 { border-bottom: 2px solid #444; padding-bottom: .2em; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .15em; margin-top: 2em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .88em; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d0d0; padding: .3em .6em; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; }
td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #e4e4e4; }
code { background: #f4f4f4; padding: 0 .2em; }
pre { background: #f6f6f6; padding: .8em; overflow-x: auto; font-size: .85em; }
"""


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def to_html(markdown_text: str, title: str, images: Mapping[str, bytes | None] = MappingProxyType({})) -> str:
    """`markdown_text` as a standalone HTML document, each image it links by a name in `images` inlined as
    a data URI. Raw HTML in the markdown is escaped, not passed through: cells hold user-supplied names. The
    images go in after rendering: markdown-it parses and percent-encodes a link character by character,
    0.16 s for a report's six figures as data URIs against 0.02 s for the page without them."""
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown_text)
    for name, png in images.items():
        if (link := f'src="{html.escape(name)}"') in body:  # a figure not drawn (None) is not linked
            body = body.replace(link, f'src="{data_uri(png)}"')
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n"
    )
