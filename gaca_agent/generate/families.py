"""Which built-in prompt template (``templates/FAMILY.txt``) fits which environment: the
agent's view of an env, kept out of the env package."""

from __future__ import annotations

#: Env id -> template family; every other env gets ``generic``.
FAMILIES: dict[str, str] = {
    "gaca/ALFWorld-v0": "alfworld",
    "gaca/TextWorld-v0": "alfworld",
    "gaca/WebShop-v0": "webshop",
    "gaca/WebShopBrowser-v0": "webshop",
    "gaca/ScienceWorld-v0": "scienceworld",
}


def family_of(env_id: str) -> str:
    """The prompt family of an env id (``generic`` for ids without their own templates)."""
    return FAMILIES.get(env_id, "generic")
