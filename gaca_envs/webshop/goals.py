"""WebShop goals (synthetic and human) and their splits, as WebShop builds them.

Synthetic goals: every product with a synthetic instruction yields one goal per
combination of its option values (``instruction with color: red, and size: large``).
Human goals: every human instruction of ``items_human_ins.json`` with attributes. Both get
a price limit above the product's price (``, and price lower than 40.00 dollars``) drawn
from a seeded generator, then are shuffled with Python's ``random.Random(233)`` exactly as
WebShop's server does, so goal k is WebShop's goal k. Splits (WebShop's): test = goals
0-499, dev = 500-1499, train = 1500 and on.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import defaultdict
from typing import Any

import numpy as np

from gaca_envs.webshop.catalog import Catalog

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
#: WebShop's splits, and ``train_dev`` (goals 500 and on: WebShop's dev + train), the
#: training split of verl-agent's WebShop runs (GiGPO's setting).
SPLITS = {"test": (0, 500), "dev": (500, 1500), "train": (1500, None), "train_dev": (500, None)}
SHUFFLE_SEED = 233


def _price_clause(price: float, rng: np.random.Generator) -> tuple[float, str]:
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return 1_000_000.0, ""
    upper = float(sorted(rng.choice(candidates, size=2, replace=False))[1])
    return upper, f", and price lower than {upper:.2f} dollars"


def synthetic_goals(catalog: Catalog, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng([seed, 1])
    goals, counts = [], defaultdict(int)
    for product in catalog.products:
        if not product.get("instruction_text"):
            continue
        attributes = product["instruction_attributes"]
        upper, price_text = _price_clause(catalog.prices[product["asin"]], rng)
        names = sorted(product["options"])
        for combo in itertools.product(*(product["options"][n] for n in names)):
            goal_options = dict(zip(names, combo))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = f" with {option_text}" if option_text else ""
            goals.append({
                "asin": product["asin"], "category": product["category"],
                "query": product["query"], "name": product["Title"],
                "product_category": product["product_category"],
                "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                "attributes": attributes, "price_upper": upper, "goal_options": goal_options,
            })
            for att in attributes:
                counts[att] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / counts[a] for a in goal["attributes"]) / len(goal["attributes"])
    random.Random(SHUFFLE_SEED).shuffle(goals)
    return goals


def human_goals(catalog: Catalog, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng([seed, 2])
    goals = []
    for product in catalog.products:
        for item in product.get("instructions", ()):
            attributes = item["instruction_attributes"]
            if not attributes:
                continue
            upper, price_text = _price_clause(catalog.prices[product["asin"]], rng)
            goals.append({
                "asin": product["asin"], "category": product["category"],
                "query": product["query"], "name": product["name"],
                "product_category": product["product_category"],
                "instruction_text": item["instruction"].strip(".") + price_text,
                "attributes": attributes, "price_upper": upper,
                "goal_options": item["instruction_options"], "weight": 1,
            })
    if not goals:
        raise ValueError("goals='human' needs a catalogue with human instructions "
                         "(items_human_ins.json, passed as human_file)")
    random.Random(SHUFFLE_SEED).shuffle(goals)
    return goals


def split_range(split: str, n_goals: int) -> range:
    """Goal indices of a split (WebShop's: test 0-499, dev 500-1499, train 1500+)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    start, stop = SPLITS[split]
    stop = n_goals if stop is None else min(stop, n_goals)
    return range(min(start, n_goals), stop)


#: The clauses a goal's instruction ends with: its options (``with color: red, and size:
#: large``) and its price (``and price lower than 40.00 dollars``).
_TAIL = re.compile(r" with [a-z]+(?: [a-z]+)?: |,? and price lower than ")


def instruction_query(text: str) -> str:
    """A search query made of words the instruction itself shows, as a shopper would type
    it: lower case, without the leading "find me", the option and price clauses and
    commas (``Find me slim, blue jeans with size: 32, and price lower than 40.00 dollars``
    -> ``slim blue jeans``)."""
    words = text.lower().strip().removeprefix("find me ")
    return " ".join(_TAIL.split(words)[0].replace(",", " ").split())
