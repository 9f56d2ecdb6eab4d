"""The generated WebShop catalogue: deterministic products in WebShop's raw format.

Made by code (no downloaded data): products across WebShop's five categories (beauty,
electronics, fashion, food, garden) with titles, descriptions, bullet points, options,
prices, attributes and a synthetic instruction in the format of ``items_ins_v2``. The
records go through the same loader as real WebShop files (:mod:`catalog`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

DEFAULT_PRODUCTS = 3000
DEFAULT_SEED = 0

COLORS = ("black", "white", "navy blue", "grey", "red", "green", "pink", "beige", "brown",
          "teal", "purple", "yellow")
_SIZES = ("small", "medium", "large", "x-large", "xx-large")

# category -> (top-level breadcrumb, product types (type, sub-category), attributes, options)
CATEGORIES: dict[str, tuple[str, tuple[tuple[str, str], ...], tuple[str, ...],
                            dict[str, tuple[str, ...]]]] = {
    "beauty": ("Beauty & Personal Care", (
        ("shampoo", "Hair Care"), ("conditioner", "Hair Care"),
        ("hair extension", "Hair Care"), ("lip balm", "Skin Care"), ("face serum", "Skin Care"),
        ("body lotion", "Skin Care"), ("nail polish", "Foot, Hand & Nail Care"),
        ("eyeliner", "Makeup"), ("deodorant", "Personal Care"), ("makeup brush", "Tools")),
        ("paraben free", "sulfate free", "cruelty free", "long lasting", "natural ingredients",
         "travel size", "easy to use", "high quality", "sensitive skin", "tea tree"),
        {"size": ("1.7 fl oz", "3.4 fl oz", "8 fl oz", "16 fl oz"),
         "scent": ("lavender", "citrus", "unscented", "vanilla", "rose")}),
    "electronics": ("Electronics", (
        ("usb microphone", "Computers & Accessories"), ("wireless earbuds", "Headphones"),
        ("phone case", "Cell Phone Accessories"), ("hdmi cable", "Cables"),
        ("bluetooth speaker", "Portable Audio"), ("watch band", "Wearable Technology"),
        ("power bank", "Batteries & Chargers"), ("tv mount", "Television Accessories"),
        ("webcam", "Computers & Accessories"), ("keyboard", "Computers & Accessories")),
        ("noise cancelling", "fast charging", "high definition", "water resistant",
         "long battery life", "easy install", "plug and play", "wireless bluetooth",
         "heavy duty", "hands free"),
        {"color": COLORS[:6], "size": ("1 pack", "2 pack", "3 pack")}),
    "fashion": ("Clothing, Shoes & Jewelry", (
        ("running shoes", "Shoes"), ("t-shirt", "Tops, Tees & Blouses"),
        ("yoga pants", "Active"), ("sandals", "Shoes"), ("hoodie", "Fashion Hoodies"),
        ("dress", "Dresses"), ("socks", "Socks & Hosiery"), ("jacket", "Coats & Jackets"),
        ("sunglasses", "Accessories"), ("backpack", "Luggage")),
        ("machine wash", "slim fit", "rubber sole", "arch support", "quick drying",
         "long sleeve", "high waist", "button closure", "relaxed fit", "faux fur"),
        {"color": COLORS, "size": _SIZES}),
    "food": ("Grocery & Gourmet Food", (
        ("green tea", "Beverages"), ("protein bar", "Snack Foods"),
        ("coffee beans", "Beverages"), ("dark chocolate", "Candy & Chocolate"),
        ("trail mix", "Snack Foods"), ("olive oil", "Pantry Staples"),
        ("gummy candy", "Candy & Chocolate"), ("beef jerky", "Meat Snacks"),
        ("almond butter", "Pantry Staples"), ("granola", "Breakfast Foods")),
        ("gluten free", "sugar free", "non gmo", "keto friendly", "low carb", "high protein",
         "usda organic", "dairy free", "kosher certified", "individually wrapped"),
        {"flavor name": ("original", "vanilla", "chocolate", "peanut butter", "sea salt",
                         "honey"),
         "size": ("pack of 1", "pack of 3", "pack of 6", "pack of 12")}),
    "garden": ("Home & Kitchen", (
        ("sofa", "Living Room Furniture"), ("bookshelf", "Home Office Furniture"),
        ("throw pillow cover", "Decorative Pillows"), ("floor lamp", "Lamps & Shades"),
        ("bath towel", "Bath"), ("storage ottoman", "Living Room Furniture"),
        ("area rug", "Rugs"), ("wall clock", "Home Decor"), ("shower curtain", "Bath"),
        ("dining chair", "Kitchen & Dining Room Furniture")),
        ("living room", "easy clean", "solid wood", "space saving", "easy assemble",
         "wood frame", "machine washable", "mid century", "stainless steel", "non slip"),
        {"color": COLORS, "size": ("small", "medium", "large")}),
}
_SYLLABLES = ("ka", "lo", "mi", "ra", "ven", "tor", "zu", "pel", "nor", "sa", "vi", "dex",
              "qua", "bri", "mon", "tal", "fer", "xo", "lun", "gar")
_NOTES = ("Designed for everyday use.", "Backed by a one-year warranty.",
          "Ships in recyclable packaging.", "Loved by thousands of customers.",
          "Makes a thoughtful gift.", "Tested for quality and safety.")


def _brand(rng: np.random.Generator) -> str:
    return "".join(rng.choice(_SYLLABLES, size=int(rng.integers(2, 4)))).capitalize()


def _product(index: int, rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, Any]]:
    category = tuple(CATEGORIES)[index % len(CATEGORIES)]
    top, types, attrs, option_space = CATEGORIES[category]
    ptype, sub = types[int(rng.integers(len(types)))]
    chosen = [str(a) for a in rng.choice(attrs, size=int(rng.integers(3, 6)), replace=False)]
    brand = _brand(rng)
    title = (f"{brand} {ptype.title()} - {chosen[0].title()}, {chosen[1].title()} "
             f"{ptype.title()} with {chosen[2].title()}")
    bullets = [f"{a.capitalize()}: this {ptype} is {a} for worry-free use." for a in chosen]
    notes = [str(n) for n in rng.choice(_NOTES, size=2, replace=False)]
    description = (f"The {brand} {ptype} is {', '.join(chosen[:-1])} and {chosen[-1]}. "
                   + " ".join(notes))
    options = {}
    names = list(option_space)
    for name in names[: int(rng.integers(0, len(names) + 1))]:
        space = option_space[name]
        values = rng.choice(space, size=int(rng.integers(2, min(4, len(space)) + 1)),
                            replace=False)
        options[name] = [{"value": str(v), "image": None} for v in values]
    low = round(float(rng.uniform(3, 120)), 2)
    pricing = f"${low}" if rng.random() < 0.7 else f"${low}${round(low * 1.3, 2)}"
    asin = f"G{index:09d}"
    raw = {"asin": asin, "name": title, "full_description": description,
           "small_description": bullets, "pricing": pricing, "customization_options": options,
           "images": [""], "category": category, "query": ptype,
           "product_category": f"{top} › {sub} › {ptype.title()}"}
    record: dict[str, Any] = {"attributes": chosen}
    if rng.random() < 0.5:
        size = min(len(chosen), int(rng.integers(1, 4)))
        goal_attrs = [str(a) for a in rng.choice(chosen, size=size, replace=False)]
        head = ", ".join(goal_attrs[:-1]) if len(goal_attrs) > 1 else goal_attrs[0]
        tail = f" with {goal_attrs[-1]}" if len(goal_attrs) > 1 else ""
        record["instruction"] = f"Find me {head} {ptype}{tail}"
        record["instruction_attributes"] = goal_attrs
    return raw, record


@lru_cache(maxsize=4)
def generate_raw(num_products: int = DEFAULT_PRODUCTS, seed: int = DEFAULT_SEED
                 ) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
    """(raw product records, attribute records keyed by asin), deterministic in the seed."""
    rng = np.random.default_rng([seed, num_products])
    products, attributes = [], {}
    for i in range(num_products):
        raw, record = _product(i, rng)
        products.append(raw)
        attributes[raw["asin"]] = record
    return tuple(products), attributes
