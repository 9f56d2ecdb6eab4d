"""The local WebShop site (Flask on 127.0.0.1) and gaca/WebShopBrowser-v0 (headless Chromium)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import gymnasium as gym
import numpy as np
import pytest

from conftest import has_module

pytestmark = pytest.mark.skipif(
    not all(has_module(m) for m in ("bm25s", "Stemmer", "thefuzz", "spacy", "flask")),
    reason="WebShop extras not installed (pip install -e '.[webshop]')")
needs_browser = pytest.mark.skipif(
    not (has_module("selenium") and shutil.which("chromium") and shutil.which("chromedriver")),
    reason="headless browser missing: apt-get install chromium chromium-driver; "
           "pip install selenium")


@pytest.fixture(scope="module")
def app():
    from gaca_envs.webshop.website import create_app
    from gaca_envs.webshop.world import WorldConfig, load_world

    return create_app(load_world(WorldConfig()), "test")


def test_routes_errors_and_escaping(app):
    client = app.test_client()
    assert client.get("/nope").status_code == 404
    assert client.get("/s/unknown").status_code == 404
    assert client.get("/start/bad id!/0").status_code in (400, 404)
    assert client.get("/start/s1/999999").status_code == 404
    assert client.get("/start/s1/0").status_code == 303
    page = client.get("/s/s1").get_data(as_text=True)
    assert "Instruction:" in page and "http://" not in page and "https://" not in page
    bad = client.post("/act/s1", data={"action": "click[buy now]"})  # not on the search page
    assert bad.status_code == 400 and "Traceback" not in bad.get_data(as_text=True)
    assert client.post("/act/s1", data={"action": "click[" + "x" * 5000 + "]"}).status_code == 400
    from gaca_envs.webshop.pages import MAX_WEBSHOP_ACTION_CHARS as limit

    # the same limit as the text env: a search of exactly `limit` characters is accepted
    too_long = "search[" + "q" * (limit - 7) + "]"
    assert client.post("/act/s1", data={"action": too_long}).status_code == 400
    client.get("/start/s2/0")
    assert client.post("/act/s2", data={"action": too_long[:-2] + "]"}).status_code == 303
    ok = client.post("/act/s1", data={"search_query": "<script>alert(1)</script>"})
    assert ok.status_code == 303
    page = client.get(ok.headers["Location"]).get_data(as_text=True)
    assert "<script>alert(1)</script>" not in page and "<script" not in page
    state = client.get("/state/s1").get_json()
    assert state["page"] == "results" and state["version"] == 1
    boom = client.get("/act/s1?action=" + "%ff" * 10)
    assert boom.status_code == 400 and "Traceback" not in boom.get_data(as_text=True)


def test_every_text_is_escaped_in_html():
    from gaca_envs.webshop.html import elements_from_html, render_html
    from gaca_envs.webshop.world import WorldConfig, load_world

    session = load_world(WorldConfig()).new_session(0)
    session.goal = dict(session.goal, instruction_text='<img src=x onerror="alert(1)"> & co')
    html = render_html(session, "s")
    assert "<img" not in html and "&lt;img src=x onerror=&#34;alert(1)&#34;&gt; &amp; co" in html
    assert ("text", '<img src=x onerror="alert(1)"> & co') in elements_from_html(html)


def test_loopback_addresses_ipv4_and_ipv6():
    from gaca_envs.webshop.website import is_loopback, url_host

    for host in ("127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "8.8.8.8", "2001:db8::1", "no-such-host.invalid"):
        assert not is_loopback(host), host
    assert url_host("::1") == "[::1]" and url_host("127.0.0.1") == "127.0.0.1"


def test_real_http_server_on_loopback_only(app):
    from gaca_envs.webshop.website import BackgroundServer

    with pytest.raises(ValueError, match="loopback"):
        BackgroundServer(app, host="0.0.0.0")
    server = BackgroundServer(app)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(server.url + "/start/h1/2") as resp:  # follows the 303
            assert resp.status == 200 and "Search" in resp.read().decode()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url + "/missing")
        assert err.value.code == 404
    finally:
        server.close()
    cli = subprocess.run([sys.executable, "-m", "gaca_envs.webshop.website", "--host",
                          "0.0.0.0"], capture_output=True, text=True, timeout=120)
    assert cli.returncode != 0 and "loopback" in cli.stderr


@pytest.fixture(scope="module")
def browser_env():
    env = gym.make("gaca/WebShopBrowser-v0", split="test")
    yield env
    env.close()


@needs_browser
def test_text_and_browser_agree_on_5_episodes(browser_env):
    text_env = gym.make("gaca/WebShop-v0", split="test")
    rng = np.random.default_rng(0)
    for k in range(5):
        ob, ib = browser_env.reset(options={"task_id": k})
        ot, it = text_env.reset(options={"task_id": k})
        assert ob == ot and ib["state_key"] == it["state_key"]
        for step in range(15):
            action = text_env.unwrapped.expert_action()
            clicks = [a for a in it["admissible_actions"] if a.startswith("click[")]
            if k % 2 and clicks and step < 4 and rng.random() < 0.5:
                action = clicks[int(rng.integers(len(clicks)))]  # wander a little
            ot, rt, tt, _, it = text_env.step(action)
            ob, rb, tb, _, ib = browser_env.step(action)
            assert ob == ot and rb == rt and ib["state_key"] == it["state_key"], action
            if tt:
                break
        assert tb and ib["score"] == it["score"]


@needs_browser
def test_crashed_browser_is_restarted_and_episode_reported_failed(browser_env):
    env = browser_env.unwrapped
    browser_env.reset(options={"task_id": 1})
    env._browser.driver.quit()  # the browser dies mid-episode
    obs, reward, terminated, truncated, info = browser_env.step("search[towel]")
    assert terminated and reward == 0.0 and "browser crashed" in info["error"]
    assert env.restarts >= 1
    obs, info = browser_env.reset(options={"task_id": 1})
    assert obs.startswith("WebShop [SEP] Instruction:")
    assert browser_env.step("search[towel]")[4]["action_valid"]
