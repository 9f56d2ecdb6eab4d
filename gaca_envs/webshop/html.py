"""HTML of a WebShop page, and the inverse: the page's visible pieces from its HTML.

:func:`render_html` draws :meth:`Session.elements` as a self-contained page (inline CSS,
no scripts or assets from elsewhere; every text and attribute escaped). Buttons and
product links send ``click[...]`` actions to ``/act/<session>``; the search form sends
``search_query``. :func:`elements_from_html` reads a page back into the same pieces,
which is how the browser environment builds its observations.
"""

from __future__ import annotations

from urllib.parse import quote

from markupsafe import escape

from gaca_envs.webshop.pages import Element, Session

_STYLE = """body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}
#instruction-text{background:#eef;padding:.5em 1em}button{margin:.2em}
.product-link{font-weight:bold}.radio-toolbar label{margin-right:1em}"""


def _action_url(session_id: str, action: str) -> str:
    return f"/act/{quote(session_id)}?action={quote(action, safe='')}"


def _button(session_id: str, text: str) -> str:
    action = f"click[{text.lower()}]"
    return (f'<form method="post" action="/act/{escape(quote(session_id))}">'
            f'<input type="hidden" name="action" value="{escape(action)}">'
            f'<button type="submit" class="btn">{escape(text)}</button></form>')


def render_html(session: Session, session_id: str = "session") -> str:
    """The current page of ``session`` as HTML."""
    clickables = session.clickables()
    parts, elements = [], session.elements()
    i = 0
    while i < len(elements):
        kind, text = elements[i]
        if text.strip() == "Instruction:" and i + 1 < len(elements):
            parts.append(f'<div id="instruction-text"><h4>{escape(text)}<br>'
                         f'{escape(elements[i + 1][1])}</h4></div>')
            i += 2
            continue
        if kind == "hidden":  # WebShop hides these with CSS; its text modes still read them
            run = []
            while i < len(elements) and elements[i][0] == "hidden":
                run.append(f"<p>{escape(elements[i][1])}</p>")
                i += 1
            parts.append(f'<div style="display:none">{"".join(run)}</div>')
            continue
        if kind == "button" and session.page.kind == "search":
            parts.append(f'<form method="post" action="/act/{escape(quote(session_id))}">'
                         '<input id="search_input" type="text" name="search_query" '
                         'placeholder="Search..." required>'
                         f'<button type="submit" class="btn">{escape(text)}</button></form>')
        elif kind == "button":
            parts.append(_button(session_id, text))
        elif kind == "link":
            href = _action_url(session_id, f"click[{text.lower()}]")
            parts.append(f'<h4><a class="product-link" href="{escape(href)}">{escape(text)}</a></h4>')
        elif kind == "label":
            name = clickables.get(text, ("option", ""))[1]
            uid = f"opt{i}"
            href = _action_url(session_id, f"click[{text}]")
            checked = " checked" if (name, text) in session.page.options else ""
            parts.append(f'<span class="radio-toolbar"><input type="radio" id="{uid}" '
                         f'name="{escape(name)}" value="{escape(text)}"{checked} '
                         f'onclick="window.location.href=this.dataset.url" '
                         f'data-url="{escape(href)}"><label for="{uid}">{escape(text)}</label>'
                         '</span>')
        else:
            parts.append(f"<p>{escape(text)}</p>")
        i += 1
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>WebShop</title>"
            "<link rel=\"icon\" href=\"data:,\">"
            f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>")


def elements_from_html(html: str) -> list[Element]:
    """The pieces of a page :func:`render_html` drew (every text node, classified as
    WebShop's text converter does; text in a ``display:none`` block is ``hidden``)."""
    from bs4 import BeautifulSoup
    from bs4.element import Comment

    soup = BeautifulSoup(html, "html.parser")
    hidden = {"style", "script", "head", "title", "meta", "[document]"}
    out: list[Element] = []
    for node in soup.find_all(string=True):
        if isinstance(node, Comment) or node.parent.name in hidden:
            continue
        parent = node.parent
        if any("display:none" in (p.get("style") or "").replace(" ", "")
               for p in node.parents if p.name == "div"):
            kind = "hidden"
        elif parent.name == "button":
            kind = "button"
        elif parent.name == "label":
            kind = "label"
        elif parent.name == "a" and "product-link" in (parent.get("class") or []):
            kind = "link"
        else:
            kind = "text"
        out.append((kind, str(node)))
    return out
