"""gaca/WebShop-v0: WebShop's reward, catalogue loading, search, pages and the expert."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from conftest import has_module

pytestmark = pytest.mark.skipif(
    not all(has_module(m) for m in ("bm25s", "Stemmer", "thefuzz", "spacy")),
    reason="WebShop extras not installed (pip install -e '.[webshop]')")


@pytest.fixture(scope="module")
def env():
    e = gym.make("gaca/WebShop-v0", split="test")
    yield e
    e.close()


def product(**kw):
    base = {"asin": "B000000001", "name": "Acme Teal Silicone Watch Band",
            "Title": "Acme Teal Silicone Watch Band", "query": "watch bands",
            "product_category": "Electronics › Wearable Technology › Bands",
            "Attributes": ["stainless steel", "quick release"],
            "BulletPoints": ["Fits 38mm and 40mm watches"],
            "Description": "A soft band that is water resistant."}
    base.update(kw)
    return base


def goal(**kw):
    base = {"asin": "B000000001", "name": "Acme Teal Silicone Watch Band",
            "query": "watch bands",
            "product_category": "Electronics › Wearable Technology › Bands",
            "attributes": ["stainless steel"], "goal_options": ["teal"], "price_upper": 20.0,
            "instruction_text": "i want a teal stainless steel band"}
    base.update(kw)
    return base


def test_reward_perfect_and_price_component():
    from gaca_envs.webshop.reward import get_reward

    score, info = get_reward(product(), goal(), price=11.98, options={"color": "teal"})
    assert score == 1.0 and info["r_type"] == 1.0 and info["r_att"] == 1.0
    assert info["r_option"] == 1.0 and info["r_price"] is True
    # each part's weight: its share of the denominator (1 attribute, 1 option, the price)
    assert info["w_att"] == info["w_option"] == info["w_price"] == pytest.approx(1 / 3)
    _, two = get_reward(product(), goal(attributes=["stainless steel", "quick release"]),
                        11.98, {"color": "teal"})
    assert (two["w_att"], two["w_option"], two["w_price"]) == pytest.approx((0.5, 0.25, 0.25))
    score, info = get_reward(product(), goal(), price=25.0, options={"color": "teal"})
    assert score == pytest.approx(2 / 3) and info["r_price"] is False  # (1 + 1 + 0) / 3


def test_reward_attribute_fuzzy_and_text_fallback():
    from gaca_envs.webshop.reward import attribute_matches

    p = product()
    # fuzzy token-set ratio > 85 against the attribute list ("steel stainless" reorders)
    assert attribute_matches(p, ["steel stainless"]) == 1
    # not an attribute, but a substring of the description / bullet points / title
    assert attribute_matches(p, ["water resistant", "38mm", "teal silicone"]) == 3
    assert attribute_matches(p, ["leather"]) == 0
    score = (0 + 1 + 1) / (1 + 1 + 1)
    from gaca_envs.webshop.reward import get_reward

    assert get_reward(p, goal(attributes=["leather"]), 10.0, {"c": "teal"})[0] == \
        pytest.approx(score)


def test_fuzzy_threshold_is_85_and_the_price_limit_inclusive():
    """Pairs whose token-set ratio lies between 50 and 85 do not match (WebShop's threshold
    is > 85), one just above it does; a price exactly at the limit is within it."""
    from thefuzz import fuzz

    from gaca_envs.webshop.reward import attribute_matches, get_reward, option_matches

    p = product(Attributes=["quick release", "high heel"], Title="Band",
                BulletPoints=["x"], Description="y")
    for goal_attr in ("quick dry", "high waist"):  # ratios 71 and 62: no match
        assert 50 < fuzz.token_set_ratio(goal_attr, p["Attributes"][0 if "quick" in goal_attr else 1]) <= 85
        assert attribute_matches(p, [goal_attr]) == 0
    assert fuzz.token_set_ratio("quick releases", "quick release") > 85
    assert fuzz.token_set_ratio("release waist", "release water") == 85  # not above it
    assert attribute_matches(product(Attributes=["release water"], Title="Band",
                                     BulletPoints=["x"], Description="y"),
                             ["release waist"]) == 0
    assert attribute_matches(p, ["quick releases"]) == 1
    assert option_matches(["quick release"], ["quick dry"]) == 0  # ratio 71
    assert option_matches(["x-large size"], ["x-large sizes"]) == 1  # ratio > 85
    g = goal(price_upper=20.0)
    at, over = get_reward(product(), g, 20.0, {"c": "teal"}), get_reward(product(), g, 20.01,
                                                                        {"c": "teal"})
    assert at[1]["r_price"] is True and at[0] == 1.0
    assert over[1]["r_price"] is False and over[0] < 1.0


def test_reward_options_colour_normalisation_and_threshold():
    from gaca_envs.webshop.reward import normalize_color, option_matches

    assert normalize_color("z2-pink") == "pink" and normalize_color("38 | 40 mm") == "38 | 40 mm"
    assert option_matches(["dark navy blue"], ["navy"]) == 0  # 'dark' is found first
    assert option_matches(["z2-pink"], ["pink"]) == 1
    assert option_matches(["x-large"], ["large"]) == 1  # token set: 'large' subset
    assert option_matches(["small"], ["large"]) == 0
    # dict goals are matched as WebShop does, through (name, value) tuples
    from gaca_envs.webshop.reward import get_reward

    g = goal(goal_options={"color": "teal", "size": "large"})
    score, info = get_reward(product(), g, 10.0, {"color": "teal", "size": "large"})
    assert info["r_option"] == 1.0 and score == 1.0
    score, info = get_reward(product(), g, 10.0, {"color": "teal", "size": "small"})
    assert info["r_option"] == 0.5 and score == pytest.approx(3 / 4)


def test_reward_type_component():
    from gaca_envs.webshop.reward import type_reward

    same = type_reward(product(), goal())
    assert same["r_type"] == 1.0 and same["query_match"] and same["category_match"]
    # another query and category, title nouns overlap > 0.2: still 1.0
    other = product(query="phone cases", product_category="Cell Phones › Cases",
                    name="Acme Watch Band Holder")
    assert type_reward(other, goal())["r_type"] == 1.0
    # no query, no category, no shared noun: 0.0
    unrelated = product(query="tea", product_category="Grocery › Tea › Green",
                        name="Organic Green Tea")
    info = type_reward(unrelated, goal())
    assert info["title_score"] == 0.0 and info["r_type"] == 0.0
    # one shared noun of many (0 < title score <= 0.2), no query/category match: 0.5
    weak = product(query="tea", product_category="Grocery › Tea › Green",
                   name="Acme Green Tea")
    info = type_reward(weak, goal())
    assert 0.1 <= info["title_score"] <= 0.2 and info["r_type"] == 0.5
    # the same title with the goal's query: the query alone keeps 1.0
    assert type_reward(product(query="watch bands", product_category="Grocery › Tea",
                               name="Acme Green Tea"), goal())["r_type"] == 1.0
    # one shared noun of more than ten (title score below 0.1): 0.1
    many = goal(name="Acme Teal Silicone Watch Band Strap Buckle Loop Case Cover Charger "
                     "Cable Stand")
    info = type_reward(unrelated | {"name": "Organic Green Charger"}, many)
    assert 0.0 < info["title_score"] < 0.1 and info["r_type"] == 0.1


def test_expert_scores_one_on_50_generated_test_goals(env):
    for k in range(50):
        env.reset(options={"task_id": k})
        for _ in range(15):
            obs, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())
            if terminated or truncated:
                break
        assert terminated and reward == 1.0 and info["won"] and info["score"] == 1.0, k


def test_the_experts_first_search_is_the_instructions_own_words(env):
    """What a language model warmed up on the expert can learn: its first query is made of
    words the observation shows (not the goal product's title, which it never sees); the
    title is searched only where those words find nothing."""
    from gaca_envs.webshop.goals import instruction_query

    assert instruction_query("Find me slim, blue jeans with size: 32, and price lower than "
                             "40.00 dollars") == "slim blue jeans"
    assert instruction_query("Find me machine washable bath towel with non slip with color: "
                             "sea green, and size: large, and price lower than 110.00 dollars"
                             ) == "machine washable bath towel with non slip"
    assert instruction_query("i need a red mug and price lower than 20.00 dollars") == \
        "i need a red mug"
    for k in range(20):
        obs, info = env.reset(options={"task_id": k})
        first = env.unwrapped.expert_action()
        assert first == f"search[{instruction_query(info['task'])}]", k
        title = env.unwrapped.session.products[env.unwrapped.session.goal["asin"]]["Title"]
        assert title.lower() not in first
    env.reset(options={"task_id": 0})
    env.step("search[zzzz qqqq]")  # words that find nothing: back, then the title
    assert env.unwrapped.expert_action() == "click[back to search]"
    env.step("click[back to search]")
    title = env.unwrapped.session.products[env.unwrapped.session.goal["asin"]]["Title"]
    assert env.unwrapped.expert_action() == f"search[{' '.join(title.lower().split())}]"


def test_pages_text_formats_and_state_keys(env):
    obs, info = env.reset(options={"task_id": 3})
    goal_text = info["task"]
    assert obs == f"WebShop [SEP] Instruction: [SEP] {goal_text} [SEP] Search"
    assert info["admissible_actions"] == ("search[<query>]",)
    obs, _, _, _, info = env.step("search[watch band]")
    assert obs.startswith(f"Instruction: [SEP] {goal_text} [SEP] Back to Search [SEP] Page 1 "
                          "(Total results: ")
    assert "click[next >]" in info["admissible_actions"]
    assert "click[< prev]" not in info["admissible_actions"]
    results_key = info["state_key"]
    first = next(a for a in info["admissible_actions"] if a.startswith("click[g"))
    _, _, _, _, item = env.step(first)
    assert {"click[description]", "click[features]", "click[reviews]", "click[buy now]"} <= \
        set(item["admissible_actions"])
    _, _, _, _, sub = env.step("click[features]")
    assert sub["admissible_actions"] == ("click[back to search]", "click[< prev]")
    assert env.step("click[< prev]")[4]["state_key"] == item["state_key"]
    assert env.step("click[< prev]")[4]["state_key"] == results_key  # same page, other path
    assert env.step("click[next >]")[4]["state_key"] != results_key
    assert env.step("click[< prev]")[4]["state_key"] == results_key
    # as in WebShop, a search is accepted on every page (but listed only on the search page)
    obs, _, _, _, info = env.step("search[anything]")
    assert info["action_valid"] and obs.startswith(f"Instruction: [SEP] {goal_text} [SEP] "
                                                   "Back to Search [SEP] Page 1")


def test_text_rich_and_html_modes_agree_with_text():
    from gaca_envs.webshop.html import elements_from_html
    from gaca_envs.webshop.pages import text_observation

    rich = gym.make("gaca/WebShop-v0", split="test", observation_mode="text_rich")
    html = gym.make("gaca/WebShop-v0", split="test", observation_mode="html")
    text = gym.make("gaca/WebShop-v0", split="test")
    for e in (rich, html, text):
        e.reset(options={"task_id": 7})
    actions = []
    while True:
        action = text.unwrapped.expert_action()
        if action is None or "buy now" in action:
            break
        actions.append(action)
        t, *_ = text.step(action)
        r, *_ = rich.step(action)
        h, *_ = html.step(action)
        assert text_observation(elements_from_html(h)) == t
        assert "http" not in h and "<script src" not in h
        if "click[g" in action:
            assert "[button] Buy Now [button_]" in r
    assert "[clicked button]" in r and "You have clicked" in r


def test_injection_and_huge_queries_are_escaped(env):
    env.reset(options={"task_id": 0})
    html_env = gym.make("gaca/WebShop-v0", split="test", observation_mode="html")
    html_env.reset(options={"task_id": 0})
    for query in ("<script>alert(1)</script>", "a" * 1_990, "x\x00\x1b[31m\u202e y"):
        obs, _, _, _, info = html_env.step(f"search[{query}]")
        assert info["action_valid"]
        assert "<script>alert" not in obs
        html_env.step("click[back to search]")
        obs, *_ = env.step(f"search[{query}]")
        env.step("click[back to search]")
    assert env.step("search[" + "a" * 100_000 + "]")[4]["action_valid"] is False  # too long


def test_splits_of_human_goal_file_and_generated_goals(env):
    from gaca_envs.data import data_path
    from gaca_envs.webshop.goals import split_range

    assert env.unwrapped.num_tasks == 500
    n_goals = len(env.unwrapped.world.goals)
    assert len(split_range("dev", n_goals)) == 1000
    assert len(split_range("train", n_goals)) == n_goals - 1500
    path = data_path("webshop", "human_goals.json")
    if path is None:
        pytest.skip("../shared/data/webshop/human_goals.json not present")
    human = json.loads(path.read_text())
    sizes = [len(split_range(s, len(human))) for s in ("test", "dev", "train")]
    assert sizes == [500, 1000, len(human) - 1500] and sum(sizes) == len(human)


def test_search_finds_products_for_real_human_queries(env):
    """Human instructions and the queries people typed (real WebShop files) get results."""
    from gaca_envs.data import data_path

    path = data_path("webshop", "goal_query_map.json")
    if path is None:
        pytest.skip("../shared/data/webshop/goal_query_map.json not present")
    queries = [q for qs in list(json.loads(path.read_text()).values())[:200] for q in qs]
    search = env.unwrapped.world.search
    hits = [search.search(q) for q in queries]
    assert all(len(h) <= 50 for h in hits)
    assert sum(bool(h) for h in hits) > 0.8 * len(hits)


def test_loads_webshop_raw_format_with_real_attribute_file(tmp_path):
    """A catalogue in WebShop's raw format, with the real items_ins_v2_1000.json."""
    from gaca_envs.data import data_path
    from gaca_envs.webshop.catalog import load_catalog, parse_pricing

    assert parse_pricing("$10.5$20") == ([10.5, 20.0], "$10.5 to $20.0")
    assert parse_pricing("$1,299.00") == ([1299.0], "$1299.0")
    assert parse_pricing(None) == ([100.0], "$100.0")
    attr_path = data_path("webshop", "items_ins_v2_1000.json")
    if attr_path is None:
        pytest.skip("../shared/data/webshop/items_ins_v2_1000.json not present")
    attributes = json.loads(attr_path.read_text())
    asins = [a for a, rec in attributes.items() if rec.get("instruction")][:20]
    raw = [{"asin": a, "name": f"Product {i} {attributes[a]['instruction_attributes'][0]}",
            "full_description": "desc", "small_description": ["point"],
            "pricing": "$5.00$9.00" if i % 2 else "$7.50",
            "customization_options": {"Color": [{"value": "Navy/Blue", "image": None}]},
            "images": ["img"], "category": "beauty", "query": " Soap ",
            "product_category": "Beauty › Soap"} for i, a in enumerate(asins)]
    raw.append(dict(raw[0]))  # duplicate asin: skipped, as WebShop does
    path = tmp_path / "items_shuffle_test.json"
    path.write_text(json.dumps(raw))
    catalog = load_catalog(path, attr_path, seed=3)
    assert len(catalog.products) == 20
    p = catalog.products[1]
    assert p["options"] == {"color": ["navy | blue"]} and p["query"] == "soap"
    assert p["Attributes"] == attributes[p["asin"]]["attributes"]
    assert 5.0 <= catalog.prices[p["asin"]] <= 9.0
    assert load_catalog(path, attr_path, seed=3).prices == catalog.prices  # seeded
    env = gym.make("gaca/WebShop-v0", catalog=str(path), attributes=str(attr_path),
                   split="test")
    env.reset(options={"task_id": 0})
    for _ in range(15):
        obs, reward, term, trunc, info = env.step(env.unwrapped.expert_action())
        if term:
            break
    assert term and reward > 0.5


# ------------------------------------------------------------------ fidelity to WebShop
def tiny_shop(tmp_path, **kwargs):
    """A two-product catalogue in WebShop's raw format: an option value with '/', an
    accented one, and one-character tokens in the texts."""
    raw = [{"asin": "B0000000AA", "name": "Acme Two Tone Watch Band",
            "full_description": "A band.", "small_description": ["Fits size 8 wrists"],
            "pricing": "$10.00", "images": [""], "category": "fashion", "query": "watch band",
            "product_category": "Fashion › Bands",
            "customization_options": {"Color": [{"value": "Black / White"},
                                                {"value": "Crème"}]}},
           {"asin": "B0000000BB", "name": "Acme Plain Watch Band",
            "full_description": "A band.", "small_description": ["Fits size 9 wrists"],
            "pricing": "$12.00", "images": [""], "category": "beauty", "query": "watch band",
            "product_category": "Beauty › Bands", "customization_options": {}}]
    return shop_of(tmp_path, raw, "band", **kwargs)


def shop_of(tmp_path, raw, attribute, **kwargs):
    """A WebShop env on the products ``raw`` (WebShop's raw format), each with one goal."""
    attrs = {p["asin"]: {"attributes": [attribute], "instruction": f"i want a {p['query']}",
                         "instruction_attributes": [attribute]} for p in raw}
    (tmp_path / "items.json").write_text(json.dumps(raw))
    (tmp_path / "attrs.json").write_text(json.dumps(attrs))
    return gym.make("gaca/WebShop-v0", catalog=str(tmp_path / "items.json"),
                    attributes=str(tmp_path / "attrs.json"), split="test", **kwargs)


def open_item(env, asin="b0000000aa"):
    goals = env.unwrapped.world.goals
    k = next(i for i, g in enumerate(goals) if g["asin"].lower() == asin)
    env.reset(options={"task_id": k})
    env.step("search[acme watch band]")
    return env.step(f"click[{asin}]")


def test_option_values_with_slashes_and_accents_are_clickable(tmp_path):
    env = tiny_shop(tmp_path)
    obs, _, _, _, info = open_item(env)
    # WebShop renders "Black / White" as "black  |  white" (two spaces each side)
    assert "black  |  white" in obs and "creme" in obs and "crème" not in obs
    # listed as WebShop lists it (its text env accepts only this form), spaces kept
    assert "click[black  |  white]" in info["admissible_actions"]
    assert "click[black | white]" not in info["admissible_actions"]
    assert "click[creme]" in info["admissible_actions"]  # what the agent is shown
    for action in ("click[black | white]", "click[black  |  white]", "click[BLACK |  White]"):
        open_item(env)
        _, _, _, _, after = env.step(action)
        assert after["action_valid"], action
        assert env.unwrapped.session.page.options == (("color", "black  |  white"),)
    for action in ("click[creme]", "click[crème]"):
        open_item(env)
        assert env.step(action)[4]["action_valid"], action
        assert env.unwrapped.session.page.options == (("color", "crème"),)


def test_item_page_lists_buttons_first_as_webshop(tmp_path):
    env = tiny_shop(tmp_path)
    _, _, _, _, info = open_item(env)
    assert info["admissible_actions"] == (
        "click[back to search]", "click[< prev]", "click[description]", "click[features]",
        "click[reviews]", "click[buy now]", "click[black  |  white]", "click[creme]")
    assert info["task_type"] == "fashion"  # the goal product's category


def test_clicked_marks_are_forgotten_after_back_to_search(tmp_path):
    env = tiny_shop(tmp_path, observation_mode="text_rich")
    open_item(env)
    obs, *_ = env.step("click[< prev]")
    assert "[clicked button] B0000000AA [clicked button_]" in obs
    env.step("click[back to search]")
    obs, *_ = env.step("search[acme watch band]")
    assert "[clicked button]" not in obs and "[button] B0000000AA [button_]" in obs


def test_one_character_tokens_are_searched(tmp_path):
    env = tiny_shop(tmp_path)
    search = env.unwrapped.world.search
    assert search.search("8")[0] == "B0000000AA"  # only product A's text has the token 8
    assert search.search("9")[0] == "B0000000BB"


def test_one_action_length_limit_for_text_env_and_site(tmp_path):
    from gaca_envs.webshop.pages import MAX_WEBSHOP_ACTION_CHARS

    env = tiny_shop(tmp_path)
    env.reset(options={"task_id": 0})
    longest = "search[" + "a" * (MAX_WEBSHOP_ACTION_CHARS - 8) + "]"
    assert env.step("search[" + "a" * MAX_WEBSHOP_ACTION_CHARS + "]")[4]["action_valid"] is False
    assert env.step(longest)[4]["action_valid"] is True
    too_long = "search[" + "a" * (MAX_WEBSHOP_ACTION_CHARS - 7) + "]"
    assert env.unwrapped.session.resolve(too_long) is None
    assert env.step(too_long)[4]["action_valid"] is False


def candle_shop(tmp_path, **kwargs):
    """A product whose style option is called "Features" (a sub-page's name), whose title
    has an en dash and a trade mark, and whose last bullet is empty."""
    raw = [{"asin": "B0000000CC", "name": "Acme Candle \u2013 8 oz\u2122",
            "full_description": "A candle.", "small_description": ["Soft", ""],
            "pricing": "$9.00", "images": [""], "category": "garden", "query": "candle",
            "product_category": "Garden \u203a Candles",
            "customization_options": {"Style": [{"value": "Features"},
                                                {"value": "Plain"}]}}]
    return shop_of(tmp_path, raw, "candle", **kwargs)


def open_candle(env):
    env.reset(options={"task_id": 0})
    env.step("search[acme candle]")
    return env.step("click[b0000000cc]")


def test_an_option_named_like_a_sub_page_opens_the_sub_page_as_in_webshop(tmp_path):
    """WebShop's server acts on the name before the kind of clickable: click[features]
    opens the Features page even where a style option is called "Features" (which can
    therefore never be chosen); the other option of that style still can."""
    env = candle_shop(tmp_path)
    _, _, _, _, info = open_candle(env)
    assert info["admissible_actions"].count("click[features]") == 1
    obs, reward, done, _, info = env.step("click[features]")
    page = env.unwrapped.session.page
    assert info["action_valid"] and page.kind == "sub" and page.sub == "Features"
    assert page.options == () and reward == 0 and not done
    env.step("click[< prev]")
    env.step("click[plain]")
    assert env.unwrapped.session.page.options == (("style", "plain"),)


def test_text_modes_keep_webshop_spaces_and_empty_pieces(tmp_path):
    """The text nodes of WebShop's templates: "Instruction: " on the search page, a space
    before each bullet, an empty bullet kept as an empty piece; punctuation in ASCII."""
    rich = candle_shop(tmp_path, observation_mode="text_rich")
    obs, _ = rich.reset(options={"task_id": 0})
    goal = rich.unwrapped.session.goal["instruction_text"]
    assert obs == f"WebShop\nInstruction: \n{goal}\n[button] Search [button_]\n"
    obs, *_ = open_candle(rich)
    assert "\nAcme Candle - 8 ozTM\n" in obs and "?" not in obs  # was "Candle ? 8 ozTM"
    obs, *_ = rich.step("click[features]")
    assert obs.endswith("[button] < Prev [button_]\n Soft\n \n")
    plain = candle_shop(tmp_path)
    open_candle(plain)
    obs, *_ = plain.step("click[features]")
    assert obs.endswith("[SEP] < Prev [SEP] Soft [SEP] ")


def test_done_page_reads_as_webshop_text_env_reads_it(tmp_path):
    """WebShop's done page hides a block with CSS that its text modes still read; the
    template gets no code, goal or reward details, so they read None or nothing."""
    env = candle_shop(tmp_path)
    open_candle(env)
    env.step("click[plain]")
    obs, reward, done, _, _ = env.step("click[buy now]")
    assert done and obs == (
        "Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in "
        "your MTurk interface.) [SEP] Purchased [SEP] asin [SEP] B0000000CC [SEP] options "
        '[SEP] {"style": "plain"} [SEP] attrs [SEP] None [SEP] category [SEP] None [SEP] '
        "query [SEP] None [SEP] product category [SEP] None [SEP] Target [SEP] asin [SEP] "
        "options [SEP] attrs [SEP] price upper [SEP] instuction text [SEP] category [SEP] "
        "product category [SEP] query [SEP] Goal [SEP] None [SEP] Reward [SEP] Your score "
        f"(min 0.0, max 1.0) [SEP] {reward} [SEP] Reward Details [SEP] None")
