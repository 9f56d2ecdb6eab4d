"""gaca-view driven in real headless Chromium (selenium): a run's curves while gaca-train
writes it, an iteration's steps and anchor groups, estimators side by side, evaluations,
the anchor audit, escaping and broken files, and the token off loopback."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import has_module

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.skipif(not (has_module("selenium") and Path("/usr/bin/chromedriver").exists()),
                       reason="needs selenium and Debian's chromium-driver"),
    pytest.mark.xdist_group("gaca_view"),  # one training run and browser for the module
]
SHOTS = Path(os.environ.get("GACA_VIEW_SHOTS", "")) if os.environ.get("GACA_VIEW_SHOTS") \
    else None
HOSTILE = '<img src=x onerror="document.title=\'pwned\'"><b>bold?</b>'


def crafted_eval(folder: Path) -> None:
    """An evaluation with hostile text, an unparsable response, task types, a failed
    episode and a partial last line."""
    folder.mkdir(parents=True)
    step = {"t": 0, "observation": HOSTILE, "admissible_actions": ["go"],
            "response": "no tags at all <script>alert(1)</script>", "action": "",
            "format_valid": False, "action_valid": False, "reward": 0.0, "state_key": "s0",
            "next_state_key": "s1", "terminated": True, "truncated": False, "nll": 1.5,
            "advantage": None, "weight": None}
    records = [
        {"index": 0, "group": 0, "task_id": 0, "task": HOSTILE, "task_type": "pick", "won": False,
         "reward": 0.0, "failed": False, "trajectory": [step]},
        {"index": 1, "group": 0, "task_id": 0, "task": "t", "task_type": "clean", "won": True,
         "reward": 1.0, "failed": False, "trajectory": [{**step, "observation": "fine",
                                                         "reward": 1.0}]},
        {"index": 2, "group": 1, "task_id": 1, "task": "t", "task_type": "clean", "won": False,
         "reward": 0.0, "failed": True, "error": "worker killed <b>here</b>", "trajectory": []},
    ]
    text = "".join(json.dumps(r) + "\n" for r in records) + '{"index": 3, "gro'
    (folder / "episodes.jsonl").write_text(text)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if not has_module("torch"):
        pytest.skip("needs torch (pip install gaca[train])")
    from gaca_agent.view.app import make_server
    from gaca_envs.webshop.browser import Browser

    runs = tmp_path_factory.mktemp("view") / "runs"
    runs.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "gaca_agent.cli.eval", "--env", "gaca/Diag-Signs-v0",
                    "--policy", "random", "--episodes", "16", "--group-size", "4",
                    "--out", str(runs / "random")], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    crafted_eval(runs / "crafted")
    train = subprocess.Popen(
        [sys.executable, "-m", "gaca_agent.cli.train", "--no-progress", "--config", "default",
         f"out_dir={runs}", "name=live", "iterations=3", "eval_every=0", "env.groups=2",
         "env.group_size=4", "env.max_live_envs=8", "warmup.bc_steps=40",
         "warmup.bc_episodes=4", "model.max_new_tokens=12", "env.invalid_penalty=-0.1",
         "keep_rollouts=true"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    server = make_server(runs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = Browser(timeout_s=30)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    yield {"runs": runs, "train": train, "driver": browser.driver, "base": base}
    browser.quit()
    server.shutdown()
    if train.poll() is None:
        train.kill()


def open_page(driver, url: str) -> None:
    """A fresh load of the page (a bare hash change would keep the last page's DOM on
    screen until the new route has fetched its data)."""
    driver.get("about:blank")
    driver.get(url)


def wait_for(driver, css: str, timeout: float = 20.0, count: int = 1):
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        if len(found) >= count:
            return found
        errors = driver.find_elements(By.CSS_SELECTOR, "#error")
        assert not errors, errors[0].text
        time.sleep(0.1)
    raise AssertionError(f"{css} did not appear (page: {driver.page_source[:2000]})")


def shot(driver, name: str) -> None:
    if SHOTS:
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.set_window_size(1400, 1000)
        driver.save_screenshot(str(SHOTS / f"{name}.png"))


def test_a_runs_curve_updates_while_gaca_train_writes_it(site):
    driver, train = site["driver"], site["train"]
    deadline = time.monotonic() + 600
    while not (site["runs"] / "live" / "metrics.jsonl").exists():
        assert train.poll() is None, train.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(1)
    open_page(driver, site["base"] + "#/run/live")
    points = []
    wait_for(driver, "#curve-success svg")
    while train.poll() is None and time.monotonic() < deadline:
        n = curve_points(driver)
        if n is not None and (not points or n != points[-1]):
            points.append(n)
        time.sleep(0.5)
    assert train.returncode == 0, train.stderr.read()[-3000:]
    time.sleep(2.5)  # the page's next refresh sees the last iteration
    final = curve_points(driver)
    # the same page, never reloaded, showed the curve growing to all 3 iterations
    assert len(points) >= 2 and points == sorted(points) and final == 3
    assert driver.execute_script("return document.getElementById('run-status').textContent"
                                 ) == "finished"
    assert len(wait_for(driver, "a.it-link", count=3)) == 3
    shot(driver, "run")


def curve_points(driver) -> int | None:
    """The success curve's point count, read in one script (the page redraws every 2 s)."""
    n = driver.execute_script("const s = document.querySelector('#curve-success svg');"
                              "return s ? s.getAttribute('data-points') : null;")
    return None if n is None else int(n)


def stored_rows(run: Path, iteration: int) -> list[dict]:
    rows = []
    for f in sorted((run / "rollouts").glob(f"iter-{iteration:05d}.*.jsonl.gz")):
        for line in gzip.open(f, "rt"):
            r = json.loads(line)
            rows += [{**s, "group": str(r["group"]), "traj": str(r["traj"])}
                     for s in r["trajectory"]]
    return rows


def test_clicking_a_step_shows_its_fields_and_its_anchor_group(site):
    from selenium.webdriver.common.by import By

    driver = site["driver"]
    assert site["train"].wait(timeout=600) == 0
    open_page(driver, site["base"] + "#/it/live/2")
    cells = wait_for(driver, "td.cell")
    rows = stored_rows(site["runs"] / "live", 2)
    assert len(cells) == len(rows)
    cell = cells[min(5, len(cells) - 1)]
    traj, t = cell.get_attribute("data-traj"), int(cell.get_attribute("data-t"))
    cell.click()
    wait_for(driver, "#step-panel")
    me = next(r for r in rows if r["traj"] == traj and r["t"] == t)
    fields = driver.find_element(By.ID, "step-fields").text
    assert me["response"] in fields and me["state_key"] in fields
    mates = [r for r in rows if r["group"] == me["group"] and r["state_key"] == me["state_key"]]
    shown = driver.find_elements(By.CSS_SELECTOR, "#anchor-group tr.mate")
    assert len(shown) == len(mates)
    assert all(me["state_key"] in tr.text for tr in shown)
    assert {(tr.find_elements(By.TAG_NAME, "td")[0].text,
             int(tr.find_elements(By.TAG_NAME, "td")[1].text)) for tr in shown} == \
        {(r["traj"], r["t"]) for r in mates}
    shot(driver, "step")


def test_estimators_side_by_side_rescore_the_stored_rollout(site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from gaca_agent.analysis.rescore import rescore, rollout_files, step_rows

    driver = site["driver"]
    assert site["train"].wait(timeout=600) == 0
    open_page(driver, site["base"] + "#/it/live/2")
    wait_for(driver, "td.cell")
    for box in driver.find_elements(By.CSS_SELECTOR, "#est-choices input"):
        if box.is_selected() != (box.get_attribute("value") in ("grpo", "gaca")):
            box.click()
    driver.find_element(By.ID, "compare-btn").click()
    summary = wait_for(driver, "#compare-summary tr", count=3)
    files, source = rollout_files(site["runs"] / "live", 2)
    want = rescore(step_rows(files), source, ["grpo", "gaca"], {}, "state")
    from gaca_agent.advantages import names

    order = [n for n in names() if n in ("grpo", "gaca")]  # the page lists the registry's order
    for tr, name in zip(summary[1:], order):
        cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        assert cells[0] == name
        assert float(cells[2]) == pytest.approx(want["estimators"][name]["std"], abs=1e-3)
    def colours():
        per_traj = {}
        for c in driver.find_elements(By.CSS_SELECTOR, "td.cell"):
            per_traj.setdefault(c.get_attribute("data-traj"), set()).add(
                c.get_attribute("style"))
        return per_traj

    assert any(len(c) > 1 for c in colours().values())  # the stored GACA advantages vary
    Select(driver.find_element(By.ID, "colour-by")).select_by_value("grpo")
    # recoloured by GRPO's advantage: every step of a trajectory gets its episode's
    assert all(len(c) == 1 for c in colours().values())
    assert wait_for(driver, "#disagreements tr", count=2)
    shot(driver, "estimators")


def test_an_evaluation_filters_by_outcome_and_two_compare_per_task_type(site):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = site["driver"]
    open_page(driver, site["base"] + "#/it/random/-1")
    wait_for(driver, "td.cell")
    records = [json.loads(x) for x in (site["runs"] / "random" / "episodes.jsonl").open()]
    Select(driver.find_element(By.ID, "filter-outcome")).select_by_value("won")
    shown = driver.find_elements(By.CSS_SELECTOR, "#groups tr")
    assert len(shown) == sum(r["won"] for r in records)
    assert all(" won" in tr.find_elements(By.TAG_NAME, "td")[0].text for tr in shown)
    open_page(driver, site["base"] + "#/suite/random/crafted")
    rows = wait_for(driver, "#suite-table tr", count=2)
    text = "\n".join(r.text for r in rows)
    won = sum(r["won"] for r in records)
    assert f"({won}/{len(records)})" in text and "(1/2)" in text  # crafted: the failed one left out
    assert {"pick", "clean", "overall"} <= {r.find_elements(By.TAG_NAME, "td")[0].text
                                             for r in rows[1:]}


def test_hostile_text_is_shown_as_text_and_broken_files_render_with_the_reason(site):
    from selenium.webdriver.common.by import By

    driver = site["driver"]
    open_page(driver, site["base"] + "#/it/crafted/-1")
    cells = wait_for(driver, "td.cell", count=2)
    assert "invalid" in cells[0].get_attribute("class")
    cells[0].click()
    panel = wait_for(driver, "#step-panel")[0]
    assert HOSTILE in panel.text and "<script>alert(1)</script>" in panel.text
    assert not driver.find_elements(By.CSS_SELECTOR, "#step-panel img, #step-panel b")
    assert HOSTILE in driver.find_element(By.ID, "groups").text  # the task, as text
    assert "worker killed <b>here</b>" in driver.find_element(By.ID, "groups").text
    assert driver.title == "gaca-view"
    shot(driver, "crafted")
    open_page(driver, site["base"] + "#/it/live/99")  # an iteration the run did not keep
    assert "kept no rollouts of iteration 99" in _error(driver)


def _error(driver) -> str:
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = driver.find_elements(By.CSS_SELECTOR, "#error")
        if found:
            return found[0].text
        time.sleep(0.1)
    raise AssertionError("no error shown")


def test_the_audit_lists_aliased_groups_and_a_click_opens_the_step(site):
    from selenium.webdriver.common.by import By

    from gaca_agent.view.credit import audit_groups
    from gaca_agent.view.store import episodes

    driver = site["driver"]
    assert site["train"].wait(timeout=600) == 0
    want = audit_groups(episodes(site["runs"] / "live", 2))
    open_page(driver, site["base"] + "#/audit/live/2")
    wait_for(driver, "#aliased")
    shown = driver.find_elements(By.CSS_SELECTOR, "#aliased tr")[1:]
    assert len(shown) == min(want["aliased_total"], 200) and want["aliased_total"] > 0
    link = driver.find_elements(By.CSS_SELECTOR, "a.audit-step")[0]
    traj, t = link.text.split(":")
    link.click()
    panel = wait_for(driver, "#step-panel")[0]
    assert f"Trajectory {traj}, step {t}" in panel.text


def test_off_loopback_needs_a_token_and_requests_without_it_are_refused(tmp_path):
    from gaca_agent.view.app import make_server

    crafted_eval(tmp_path / "e")
    with pytest.raises(ValueError, match="without a token"):
        make_server(tmp_path, host="0.0.0.0")
    server = make_server(tmp_path, token="s3cret")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/api/runs")
        assert err.value.code == 401
        runs = json.load(urllib.request.urlopen(base + "/api/runs?token=s3cret"))
        assert [r["name"] for r in runs] == ["e"]
        req = urllib.request.Request(base + "/api/iteration?name=../..&it=-1",
                                     headers={"Authorization": "Bearer s3cret"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req)
        assert err.value.code == 404 and b"outside" in err.value.read()
    finally:
        server.shutdown()
