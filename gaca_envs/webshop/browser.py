"""``gaca/WebShopBrowserEnv-v0``: the WebShop tasks acted out in headless Chromium.

The env serves the local site from a thread on 127.0.0.1 and drives Debian's Chromium
through selenium: ``search[q]`` types into the search box and submits, ``click[x]``
clicks the button, product link or option label with that text. Observations are read
back from the browser's page; score and state key come from the site's session. The same
actions give the same scores as ``gaca/WebShop-v0``. A crashed browser is restarted and
its episode reported as failed (terminated, reward 0, ``info["error"]``), not lost.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from typing import Any
from urllib.parse import quote

from gaca_envs.core import SimStep
from gaca_envs.webshop.env import WebShopEnv
from gaca_envs.webshop.html import elements_from_html
from gaca_envs.webshop.pages import parse_action, rich_observation, text_observation

CHROME_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage")
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"


class Browser:
    """One headless Chromium with a fresh profile; ``quit`` removes both."""

    def __init__(self, timeout_s: float = 20.0) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        if not shutil.which(CHROMEDRIVER):
            raise FileNotFoundError(f"{CHROMEDRIVER} not found: apt-get install chromium "
                                    "chromium-driver")
        self.profile = tempfile.mkdtemp(prefix="gaca-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in CHROME_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self.profile}")
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_page_load_timeout(timeout_s)
        self.timeout_s = timeout_s

    def load(self, url: str) -> None:
        self.driver.get(url)
        self._wait_page()

    def _wait_page(self, before: str | None = None) -> None:
        """Wait until a new, fully loaded WebShop page is shown."""
        from selenium.webdriver.support.ui import WebDriverWait

        def ready(d) -> bool:
            if before is not None and d.current_url == before:
                return False
            if d.execute_script("return document.readyState") != "complete":
                return False
            return bool(d.execute_script(
                "return document.getElementById('instruction-text') !== null || "
                "document.body.innerText.indexOf('Thank you for shopping') >= 0"))

        WebDriverWait(self.driver, self.timeout_s, poll_frequency=0.02).until(ready)

    def act(self, action: str) -> None:
        """Perform a (valid) action on the current page and wait for the next one."""
        from selenium.webdriver.common.by import By

        before = self.driver.current_url
        name, arg = parse_action(action)  # type: ignore[misc]
        if name == "search":
            box = self.driver.find_element(By.ID, "search_input")
            box.send_keys(arg)
            box.submit()
        else:
            self._element_for(arg).click()
        self._wait_page(before)

    def _element_for(self, label: str):
        from selenium.webdriver.common.by import By

        candidates = (self.driver.find_elements(By.TAG_NAME, "button")
                      + self.driver.find_elements(By.CSS_SELECTOR, "a.product-link")
                      + self.driver.find_elements(By.TAG_NAME, "label"))
        # rendered text collapses runs of spaces ("black  |  white" shows one each side)
        wanted = " ".join(label.split())
        matches = [e for e in candidates if " ".join(e.text.split()).lower() == wanted]
        if not matches:
            raise LookupError(f"no element labelled {label!r} on the page")
        return matches[-1]  # a value shared by two options belongs to the later one

    @property
    def html(self) -> str:
        return self.driver.page_source

    def quit(self) -> None:
        try:
            self.driver.quit()
        except Exception:  # noqa: BLE001 - the process may already be gone
            pass
        shutil.rmtree(self.profile, ignore_errors=True)


class WebShopBrowserEnv(WebShopEnv):
    """WebShop in a real headless Chromium against the local site (same tasks and reward
    as ``gaca/WebShop-v0``; same arguments). See the module docstring."""

    _ids = itertools.count()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from gaca_envs.webshop.website import BackgroundServer, create_app

        self._app = create_app(self.world, self.split, self.show_attrs)
        self._server = BackgroundServer(self._app)
        self._browser: Browser | None = None
        self._sid = ""
        self.restarts = 0

    # ------------------------------------------------------------- browser
    def _ensure_browser(self) -> Browser:
        if self._browser is None:
            self._browser = Browser()
        return self._browser

    def _restart_browser(self) -> None:
        if self._browser is not None:
            self._browser.quit()
        self._browser = None
        self.restarts += 1

    def close(self) -> None:
        if self._browser is not None:
            self._browser.quit()
            self._browser = None
        self._server.close()
        super().close()

    # ------------------------------------------------------------- adapter
    def _sim_reset(self, task_id: int) -> SimStep:
        self._searched = []
        self._sid = f"ep{next(self._ids)}"
        for attempt in range(2):
            try:
                self._ensure_browser().load(f"{self._server.url}/start/{self._sid}/{task_id}")
                break
            except Exception:  # noqa: BLE001 - a dead browser: start a new one once
                self._restart_browser()
                if attempt:
                    raise
        self.session = self._app.extensions["gaca_sessions"][self._sid]["session"]
        return self._sim(0.0)

    def _sim_step(self, action: str) -> SimStep:
        assert self.session is not None and self._browser is not None
        if action.startswith("search["):
            self._searched.append(action)
        try:
            if action.startswith("search[") and self.session.page.kind != "search":
                # a search from a page without a search box (WebShop accepts it): the
                # site's action URL, as a form would send it
                self._browser.load(f"{self._server.url}/act/{self._sid}?action="
                                   f"{quote(action, safe='')}")
            else:
                self._browser.act(action)
        except Exception as err:  # noqa: BLE001 - selenium raises many kinds
            self._restart_browser()
            return SimStep(f"The browser failed: {type(err).__name__}. Episode over.", (),
                           self.session.page.key(), reward=0.0, terminated=True,
                           extra_info={"score": 0.0, "error": f"browser crashed: {err!r}"[:500]})
        reward = float(self.session.score or 0.0) if self.session.page.kind == "done" else 0.0
        return self._sim(reward)

    def _observe(self) -> str:
        s = self.session
        assert s is not None and self._browser is not None
        html = self._browser.html
        if self.observation_mode == "html":
            return html
        elements = elements_from_html(html)
        if self.observation_mode == "text":
            return text_observation(elements)
        return rich_observation(elements, dict(s.page.options).values(), s.clicked)
