"""``gaca/WebShop-v0``: WebShop's shopping tasks on our own engine."""

from __future__ import annotations

from typing import Any

from gaca_envs.core import MAX_ACTION_CHARS, Anchor, SimStep, TextEnv, to_charset
from gaca_envs.webshop.goals import instruction_query
from gaca_envs.webshop.pages import BACK, BUY, NEXT, PREV, SPECIAL_CLICKS, Session, observe
from gaca_envs.webshop.world import GoalSource, World, WorldConfig, load_world

OBSERVATION_MODES = ("text", "text_rich", "html")


class WebShopEnv(TextEnv):
    """WebShop (Yao et al., 2022): find and buy the product an instruction describes.

    ## Description
    A simulated online shop. The instruction names a product, attributes, options and a
    price limit; the agent searches, opens products, chooses options, reads sub-pages and
    buys. Pages, actions and scoring follow WebShop's server and ``get_reward``; the
    engine is ours (no Java, no CDN, seeded prices). Catalogue: the bundled generated one
    (3,000 products in WebShop's five categories, ~6,000 goals) or any WebShop product
    file (``catalog=PATH``, with its attribute file).

    ## Action Space
    ``search[QUERY]`` and ``click[LABEL]`` for a button (``back to search``, ``next >``,
    ``< prev``, ``description``, ``features``, ``reviews``, ``buy now``), a product (its
    asin) or an option value. As in WebShop, a search is accepted on every page of an
    unfinished episode, a click must name a clickable of the page, matching ignores case,
    and an action longer than 2,000 characters is invalid (the local site's limit too).
    ``info["admissible_actions"]`` lists what WebShop's own text env lists, in its order:
    ``search[<query>]`` (any query) on the search page only, else the page's buttons,
    then product links, then option values.

    Options are listed with WebShop's spaces (``click[black  |  white]`` for ``Black /
    White``). A name WebShop's server acts on wins over the kind of clickable: where an
    option is called ``Features``, ``click[features]`` opens the Features page.

    Differences from WebShop, and why: text is printable ASCII, the observation space's
    charset (punctuation in its ASCII spelling, ``–`` as ``-`` and ``™`` as ``TM``;
    ``crème`` is shown, listed and accepted as ``creme``; ``click[crème]`` works too); a
    click also matches with collapsed whitespace (``click[black | white]``), which an
    agent copying a normalised action would type.

    ## Observation Space
    ``observation_mode``: ``text`` (visible texts joined by ``[SEP]``), ``text_rich``
    (``[button] ... [button_]`` marks, one piece a line) or ``html``;
    the pieces are the text nodes of WebShop's templates, spaces and empty pieces kept, and
    the done page includes the block WebShop hides with CSS (its text modes read it).

    ## Starting State
    The search page of goal ``k`` of the split (``options={"task_id": k}``), else a goal
    drawn with ``np_random``. Splits (WebShop's): test = goals 0-499, dev = 500-1499,
    train = 1500+, for human goals and for the generated goals alike; ``train_dev`` =
    500+ is verl-agent's training split (GiGPO's setting).

    ## Rewards
    WebShop's score in [0, 1] on ``click[buy now]``; 0 otherwise. ``info["score"]``.

    ## Episode End
    Terminated on buying; ``won`` when the score is 1. ``max_episode_steps=15``. Steps
    after buying are no-ops (reward 0, ``terminated`` stays True, ``action_valid=False``).

    ## Info
    Contract keys plus ``score`` and ``task_type`` (the goal product's category:
    ``beauty``, ``electronics``, ``fashion``, ``food``, ``garden`` in WebShop's data), so
    results break down by category; ``state_key`` hashes page type, query, results page,
    product, chosen options and sub-page (the same page by any path has one key). In
    ``text_rich`` mode, ``[clicked button]`` marks of visited products are forgotten on
    ``back to search``, as WebShop starts its session over there. ``env.unwrapped.
    expert_action()`` searches the goal product's title, opens it, picks the goal options
    and buys (score 1.0 on generated goals).

    ## Memory
    The world (catalogue, search index, goals) is loaded once per process and shared by
    its envs: 128 live episodes in the collector's 8 workers hold 2.1 GB, as 16 do (PSS
    of every process; 17 MB an episode; ``benchmarks/bench_env_memory.py --suite
    webshop``).

    ## Arguments
    ``split``, ``goals`` (``synthetic``/``human``), ``catalog``, ``attributes``,
    ``human_file``, ``num_products``, ``seed`` (prices and price limits),
    ``observation_mode``, ``show_attrs``, ``search_backend`` (``bm25s``/``pyserini``),
    ``index_dir``, ``anchor``, ``render_mode``.

    ## Version History
    v0: initial version.
    """

    def __init__(self, split: str = "train", goals: GoalSource = "synthetic",
                 catalog: str | None = None, attributes: str | None = None,
                 human_file: str | None = None, num_products: int | None = None,
                 seed: int = 0, observation_mode: str = "text", show_attrs: bool = False,
                 search_backend: str = "bm25s", index_dir: str | None = None,
                 anchor: Anchor = "state", render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode, anchor=anchor)
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f"observation_mode must be one of {OBSERVATION_MODES}, "
                             f"got {observation_mode!r}")
        if goals not in ("synthetic", "human"):
            raise ValueError(f"goals must be 'synthetic' or 'human', got {goals!r}")
        self.world: World = load_world(WorldConfig(
            catalog=str(catalog) if catalog else None, attributes=attributes,
            human_file=human_file, goals=goals, num_products=num_products, seed=seed,
            search_backend=search_backend, index_dir=index_dir))  # type: ignore[arg-type]
        self.goal_ids = self.world.split(split)
        if len(self.goal_ids) == 0:
            raise ValueError(f"split {split!r} has no goals ({len(self.world.goals)} in all)")
        self.split, self.observation_mode, self.show_attrs = split, observation_mode, show_attrs
        self.session: Session | None = None
        self._searched: list[str] = []

    @property
    def num_tasks(self) -> int:
        return len(self.goal_ids)

    def goal(self, task_id: int) -> dict[str, Any]:
        return self.world.goals[self.goal_ids[task_id]]

    def _sim_task(self, task_id: int) -> str:
        return self.goal(task_id)["instruction_text"]

    def _sim_reset(self, task_id: int) -> SimStep:
        self.session = self.world.new_session(self.goal_ids[task_id], self.show_attrs)
        self._searched = []
        return self._sim(0.0)

    def _resolve(self, action: str) -> str | None:
        return None if self.session is None else self.session.resolve(action)

    def _listed_form(self, raw: str, normalised: str) -> str:
        """WebShop's spelling, spaces kept (``click[black  |  white]``, as WebShop lists
        it; the collapsed form is accepted too), in ASCII."""
        return to_charset(raw, MAX_ACTION_CHARS)

    def _sim_step(self, action: str) -> SimStep:
        assert self.session is not None
        if action.startswith("search["):
            self._searched.append(action)
        return self._sim(self.session.act(action))

    def _observe(self) -> str:
        """The current page in the observation mode (the browser env reads its page)."""
        assert self.session is not None
        if self.observation_mode == "html":
            from gaca_envs.webshop.html import render_html

            return render_html(self.session)
        return observe(self.session, self.observation_mode)

    def _sim(self, reward: float) -> SimStep:
        s = self.session
        assert s is not None
        done = s.page.kind == "done"
        return SimStep(self._observe(), s.admissible(), s.page.key(),
                       reward=reward, terminated=done, won=done and s.score == 1.0,
                       extra_info={"score": float(s.score or 0.0),
                                   "task_type": s.goal.get("category")})

    def expert_action(self) -> str | None:
        """The oracle: search as a shopper would (the instruction's own words), then by the
        goal product's title where those words do not find it; open it, choose the goal
        options, buy. Its first query is one a policy can learn from the observation."""
        s = self.session
        if s is None or s.page.kind == "done":
            return None
        goal, page = s.goal, s.page
        target = goal["asin"]
        if page.kind == "search":
            product = s.products[target]
            queries = [instruction_query(goal["instruction_text"]), product["Title"],
                       goal["query"] + " " + " ".join(goal["attributes"])]
            query = queries[min(len(self._searched), len(queries) - 1)].lower()
            return f"search[{' '.join(query.split())}]"
        if page.kind == "sub" or (page.kind == "item" and page.asin != target):
            return f"click[{PREV}]"
        if page.kind == "results":
            if target in s.page_results():
                return f"click[{target.lower()}]"
            further = s.results()[page.page * 10:]
            return f"click[{NEXT}]" if target in further else f"click[{BACK}]"
        wanted = (goal["goal_options"].values() if isinstance(goal["goal_options"], dict)
                  else goal["goal_options"])
        chosen = {v for _, v in page.options}
        clickables = s.clickables()
        for value in wanted:  # (an option spelled like a button cannot be chosen)
            if value not in chosen and value in clickables and value not in SPECIAL_CLICKS:
                return f"click[{value}]"
        return f"click[{BUY}]"

