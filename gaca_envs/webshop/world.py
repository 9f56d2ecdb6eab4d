"""A WebShop world: catalogue, search index and goals, built once and shared.

``load_world`` is cached per process, so every environment (text, browser, the local
site) over the same configuration shares one catalogue and one index.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from gaca_envs.data import data_path
from gaca_envs.webshop.catalog import Catalog, build_catalog, load_catalog
from gaca_envs.webshop.goals import human_goals, split_range, synthetic_goals
from gaca_envs.webshop.pages import Session
from gaca_envs.webshop.reward import get_reward
from gaca_envs.webshop.search import BM25Search, PyseriniSearch

GoalSource = Literal["synthetic", "human"]


@dataclass(frozen=True)
class WorldConfig:
    """What defines a WebShop world (all hashable, so worlds can be cached)."""

    catalog: str | None = None
    """A WebShop product file (``items_shuffle_1000.json``...); None: the generated one."""
    attributes: str | None = None
    """Its attribute file (``items_ins_v2_1000.json``...); None: look beside the catalogue
    and in $GACA_DATA/webshop."""
    human_file: str | None = None
    """``items_human_ins.json`` for human goals."""
    goals: GoalSource = "synthetic"
    num_products: int | None = None
    seed: int = 0
    search_backend: Literal["bm25s", "pyserini"] = "bm25s"
    index_dir: str | None = None


@dataclass
class World:
    config: WorldConfig
    catalog: Catalog
    goals: list[dict[str, Any]]
    search: Any

    def split(self, split: str) -> range:
        return split_range(split, len(self.goals))

    def new_session(self, goal_index: int, show_attrs: bool = False) -> Session:
        return Session(self.goals[goal_index], self.catalog.by_asin, self.catalog.prices,
                       self.search.search, get_reward, show_attrs)


def _attribute_file(config: WorldConfig) -> str | None:
    if config.attributes:
        return config.attributes
    if config.catalog:
        for name in ("items_ins_v2_1000.json", "items_ins_v2.json"):
            for folder in (Path(config.catalog).parent, data_path("webshop")):
                if folder is not None and (folder / name).is_file():
                    return str(folder / name)
    return None


@lru_cache(maxsize=8)
def load_world(config: WorldConfig) -> World:
    if config.catalog is None:
        from gaca_envs.webshop.generate import DEFAULT_PRODUCTS, generate_raw

        raw, attributes = generate_raw(config.num_products or DEFAULT_PRODUCTS, config.seed)
        catalog = build_catalog(list(raw), attributes, None, None, config.seed)
    else:
        catalog = load_catalog(config.catalog, _attribute_file(config), config.human_file,
                               config.num_products, config.seed)
    goals = (human_goals(catalog, config.seed) if config.goals == "human"
             else synthetic_goals(catalog, config.seed))
    if config.search_backend == "pyserini":
        if not config.index_dir:
            raise ValueError("search_backend='pyserini' needs index_dir (a Lucene index)")
        search = PyseriniSearch(config.index_dir)
    else:
        search = BM25Search(catalog.products)
    return World(config, catalog, goals, search)
