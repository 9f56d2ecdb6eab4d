"""WebShop's site as a state machine: pages, clickables, transitions and renderings.

One :class:`Session` is one shopper on one goal. ``act(action)`` applies ``search[...]`` or
``click[...]`` as WebShop's server does; ``elements()`` lists the page's visible pieces
(text, buttons, option labels, product links) in page order, from which the ``text`` and
``text_rich`` observations are built in WebShop's formats, and ``render_html`` draws the
same page as self-contained HTML (no external assets) for the local site.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal

from gaca_envs.core import normalize_action, stable_hash, to_charset

PRODUCT_WINDOW = 10
BUY, NEXT, PREV, BACK = "buy now", "next >", "< prev", "back to search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")
#: The longest action the text env and the local site accept (longer ones are invalid).
MAX_WEBSHOP_ACTION_CHARS = 2000
#: Names WebShop's server acts on whatever kind of clickable carries them (``next >`` only
#: on a results page): an option with such a value cannot be chosen there either.
SPECIAL_CLICKS = frozenset({BUY, BACK, PREV, *(s.lower() for s in SUB_PAGES)})
_ACTION_RE = re.compile(r"^(search|click)\[(.*)\]$", re.DOTALL)

PageKind = Literal["search", "results", "item", "sub", "done"]
Element = tuple[str, str]  # (kind: text|button|label|link|hidden, text)


@dataclass(frozen=True)
class Page:
    """Everything that decides what the shopper sees (the state key hashes it)."""

    kind: PageKind = "search"
    keywords: tuple[str, ...] = ()
    page: int = 1
    asin: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    sub: str | None = None

    def key(self) -> str:
        return stable_hash(["webshop", self.kind, " ".join(self.keywords), str(self.page),
                            self.asin or "", json.dumps(self.options), self.sub or ""])


def parse_action(action: str) -> tuple[str, str] | None:
    """``search[q]``/``click[x]`` -> (name, argument), else None."""
    match = _ACTION_RE.match(action.strip())
    return (match.group(1), match.group(2).strip()) if match else None


@dataclass
class Session:
    """One shopper: the goal, the current page, the clicked products, the outcome."""

    goal: dict[str, Any]
    products: dict[str, dict[str, Any]]
    prices: dict[str, float]
    search: Callable[[str], list[str]]
    score_fn: Callable[..., tuple[float, dict[str, Any]]]
    show_attrs: bool = False
    page: Page = field(default_factory=Page)
    clicked: set = field(default_factory=set)
    score: float | None = None
    score_info: dict[str, Any] | None = None
    _results: dict[tuple[str, ...], list[str]] = field(default_factory=dict)

    # ------------------------------------------------------------- queries
    def results(self) -> list[str]:
        keywords = self.page.keywords
        if keywords not in self._results:
            self._results[keywords] = self.search(" ".join(keywords))
        return self._results[keywords]

    def page_results(self) -> list[str]:
        start = (self.page.page - 1) * PRODUCT_WINDOW
        return self.results()[start:start + PRODUCT_WINDOW]

    def clickables(self) -> dict[str, tuple[str, str]]:
        """Clickable label -> (kind, option name or ""), in the order WebShop's text env
        lists them: the page's buttons, then product links, then option values (lower
        case; an option value shared by two options maps to the later one)."""
        out: dict[str, tuple[str, str]] = {}
        kind = self.page.kind
        if kind in ("results", "item", "sub"):
            out[BACK] = ("button", "")
        if kind == "results":
            if self.page.page > 1:
                out[PREV] = ("button", "")
            out[NEXT] = ("button", "")
            for asin in self.page_results():
                out[asin.lower()] = ("link", "")
        elif kind == "item":
            out[PREV] = ("button", "")
            for sub in self.sub_pages():
                out[sub.lower()] = ("button", "")
            out[BUY] = ("button", "")
            product = self.products[self.page.asin]
            for name, values in product["options"].items():
                for value in values:
                    out.pop(value, None)  # keep WebShop's order for a repeated value
                    out[value] = ("option", name)
        elif kind == "sub":
            out[PREV] = ("button", "")
        return out

    def _click_lookup(self) -> dict[str, str]:
        """Each clickable label under the forms an agent may type it in: as WebShop
        writes it, and as shown in ASCII with collapsed whitespace (``black  |  white``
        and ``black | white``; ``crème`` and ``creme``)."""
        lookup: dict[str, str] = {}
        for label in self.clickables():
            lookup.setdefault(label, label)
            lookup.setdefault(normalize_action(to_charset(label)), label)
            lookup.setdefault(normalize_action(label), label)
        return lookup

    def sub_pages(self) -> tuple[str, ...]:
        return SUB_PAGES if self.show_attrs else SUB_PAGES[:3]

    def admissible(self) -> tuple[str, ...]:
        """What WebShop's text env lists: ``search[<query>]`` (a template: any query) on
        the search page, else the page's clicks (``search[...]`` is also accepted there,
        as in WebShop, but not listed, as in WebShop)."""
        clicks = tuple(f"click[{c}]" for c in self.clickables())
        return ("search[<query>]",) if self.page.kind == "search" else clicks

    def resolve(self, action: str) -> str | None:
        """The canonical form of an action valid now (``click[<label as WebShop writes
        it>]`` or ``search[<query>]``), or ``None``. Like WebShop: a non-empty search is
        accepted on every page of an unfinished episode; a click must name a clickable of
        the page; matching is case-insensitive. Unlike WebShop, a click may also collapse
        whitespace and use the ASCII form the observation shows."""
        if self.page.kind == "done" or len(action) > MAX_WEBSHOP_ACTION_CHARS:
            return None
        parsed = parse_action(action)
        if parsed is None:
            return None
        name, arg = parsed
        if name == "search":
            query = " ".join(arg.lower().split())
            return f"search[{query}]" if query else None
        label = self._click_lookup().get(arg.lower())
        if label is None:
            label = self._click_lookup().get(normalize_action(to_charset(arg)))
        return None if label is None else f"click[{label}]"

    # ------------------------------------------------------------- transitions
    def act(self, action: str) -> float:
        """Apply a valid action (see :meth:`resolve`); returns the reward (score on buy)."""
        canonical = self.resolve(action)
        if canonical is None:
            raise ValueError(f"{action!r} is not a valid action on the {self.page.kind} page")
        name, arg = parse_action(canonical)  # type: ignore[misc]
        page = self.page
        if name == "search":
            self.page = Page("results", tuple(arg.split(" ")), 1)
            return 0.0
        kind, option_name = self.clickables()[arg]
        # WebShop dispatches on the name before the kind: an option value spelled like a
        # button (a style option "Features") does what the button does
        if arg in SPECIAL_CLICKS or (arg == NEXT and page.kind == "results"):
            kind = "button"
        if arg == BACK:  # WebShop starts the session over: clicked products are forgotten
            self.page = Page()
            self.clicked = set()
        elif arg == NEXT and kind == "button":
            self.page = replace(page, page=page.page + 1)
        elif arg == PREV and page.kind == "results":
            self.page = replace(page, page=page.page - 1)
        elif arg == PREV and page.kind == "sub":
            self.page = replace(page, kind="item", sub=None)
        elif arg == PREV:  # item page: back to its results page
            self.page = Page("results", page.keywords, page.page)
        elif kind == "link":
            asin = arg.upper()
            self.clicked.add(asin)
            self.page = Page("item", page.keywords, page.page, asin)
        elif kind == "option":
            options = dict(page.options)
            options[option_name] = arg
            self.page = replace(page, options=tuple(sorted(options.items())))
        elif arg == BUY:
            return self._buy()
        else:
            sub = next(s for s in SUB_PAGES if s.lower() == arg)
            self.page = replace(page, kind="sub", sub=sub)
        return 0.0

    def _buy(self) -> float:
        asin = self.page.asin
        assert asin is not None
        self.score, self.score_info = self.score_fn(
            self.products[asin], self.goal, price=self.prices[asin],
            options=dict(self.page.options))
        self.page = replace(self.page, kind="done", sub=None)
        return self.score

    # ------------------------------------------------------------- renderings
    def elements(self) -> list[Element]:
        """Visible page pieces in order, (``text``|``button``|``label``|``link``|``hidden``,
        text): the text nodes WebShop's templates make, with their spaces (``Instruction: ``
        on the search page, a space before each bullet), a node for every piece that is not
        empty, and the done page's block that WebShop hides with CSS but its text modes
        read (``hidden``)."""
        p, instruction = self.page, self.goal["instruction_text"]
        if p.kind == "search":
            return [("text", "WebShop"), ("text", "Instruction: "), *_node("text", instruction),
                    ("button", "Search")]
        if p.kind == "done":
            return self._done_elements()
        out: list[Element] = [("text", "Instruction:"), *_node("text", instruction),
                              ("button", "Back to Search")]
        if p.kind == "results":
            out.append(("text", f"Page {p.page} (Total results: {len(self.results())})"))
            if p.page > 1:
                out.append(("button", "< Prev"))
            out.append(("button", "Next >"))
            for asin in self.page_results():
                product = self.products[asin]
                out += [("link", asin), *_node("text", product["Title"]),
                        *_node("text", product["Price"])]
            return out
        product = self.products[p.asin]
        out.append(("button", "< Prev"))
        if p.kind == "item":
            for name, values in product["options"].items():
                out += _node("text", name)
                out += [e for v in values for e in _node("label", v)]
            out += [*_node("text", product["Title"]), ("text", f"Price: {product['Price']}"),
                    ("text", f"Rating: {product['Rating']}")]
            out += [("button", s) for s in self.sub_pages()]
            out.append(("button", "Buy Now"))
        elif p.sub == "Description":
            out += _node("text", product["Description"])
        elif p.sub == "Features":
            out += [("text", f" {b}") for b in product["BulletPoints"]]
        elif p.sub == "Reviews":
            for r in product["Reviews"]:
                out += [("text", f'"{r.get("title", "")}"'),
                        *_node("text", str(r.get("score", ""))),
                        *_node("text", r.get("body", ""))]
        else:
            out += [("text", f" {a}") for a in product["Attributes"]]
        return out

    def _done_elements(self) -> list[Element]:
        """WebShop's done page as its text env renders it (no code, goal or reward details
        are passed to the template, so they read ``None`` or nothing)."""
        chosen = json.dumps(dict(self.page.options), sort_keys=True)
        for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                           ("'", "\\u0027")):  # Jinja's tojson, as WebShop's page shows it
            chosen = chosen.replace(char, code)
        hidden = ["Purchased", "asin", self.page.asin or "", "options", chosen]
        for label in ("attrs", "category", "query", "product category"):
            hidden += [label, "None"]
        hidden += ["Target", "asin", "options", "attrs", "price upper", "instuction text",
                   "category", "product category", "query", "Goal ", "None", "Reward"]
        return [("text", "Thank you for shopping with us!"), ("text", "Your code: "),
                ("text", "None"), ("text", " (Paste it in your MTurk interface.)"),
                *[("hidden", h) for h in hidden if h],
                ("text", "Your score (min 0.0, max 1.0)"), ("text", f"{self.score}"),
                ("hidden", "Reward Details "), ("hidden", "None")]


def _node(kind: str, text: str) -> list[Element]:
    """The text node a template makes of ``text`` alone in its tag: none when empty."""
    return [(kind, text)] if text else []


def text_observation(elements: list[Element]) -> str:
    """WebShop's ``text`` mode: every text node, stripped, joined by `` [SEP] `` (a node of
    spaces only, such as an empty bullet's, stays as an empty piece, as in WebShop)."""
    return " [SEP] ".join(t.strip() for _, t in elements)


def rich_observation(elements: list[Element], chosen, clicked) -> str:
    """WebShop's ``text_rich`` mode: one line per piece, buttons marked ``[button]``."""
    chosen, head, lines = set(chosen), "", []
    for kind, t in elements:
        if kind == "button":
            lines.append(f"[button] {t} [button_]")
        elif kind == "label" and t in chosen:
            lines.append(f"  [clicked button] {t} [clicked button_]")
            head = f"You have clicked {t}.\n" + head
        elif kind == "label":
            lines.append(f"  [button] {t} [button_]")
        elif kind == "link":
            mark = "clicked button" if t in clicked else "button"
            lines.append(f"\n[{mark}] {t} [{mark}_]")
        else:
            lines.append(t)
    return head + "".join(line + "\n" for line in lines)


def observe(session: Session, mode: str) -> str:
    """The session's page as the agent sees it in WebShop's ``text`` or ``text_rich`` form
    (the ``html`` form is drawn by :mod:`gaca_envs.webshop.html`)."""
    if mode == "text":
        return text_observation(session.elements())
    if mode == "text_rich":
        return rich_observation(session.elements(), dict(session.page.options).values(),
                                session.clicked)
    raise ValueError(f"observation_mode must be text, text_rich or html, got {mode!r}")
