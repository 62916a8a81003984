"""Headless Chromium for the explainer page's tests and screenshots: Debian's `chromium` and `chromium-driver`
(`apt-get install -y chromium chromium-driver`), driven by selenium through /usr/bin/chromedriver. The driver's path
is given to selenium, so Selenium Manager (which would download a browser) never runs.

- `missing()`: why the browser cannot run here (None when it can);
- `chromium()`: a headless browser that logs the console and the network (`console_errors`, `requests`);
- `screenshot_views(driver, prefix)`: one PNG per view of a loaded explainer page, `prefix-<view>.png`.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
VIEWS = ("translation", "beam", "cross", "self", "head", "rnn", "compare")  # the page's sections: view-<name>


def missing() -> str | None:
    """Why the browser tests cannot run on this machine, or None."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[test]')"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).is_file():
            return f"{path} is missing: apt-get install -y chromium chromium-driver (Debian package {package})"
    return None


@contextlib.contextmanager
def chromium(width: int = 1366, height: int = 900) -> Iterator:
    """A headless Chromium (a laptop-sized window) that records its console and network logs."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver) -> list[str]:
    """The console's errors (and uncaught exceptions) since the last call."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]


def requests(driver) -> list[str]:
    """The URLs the page asked for since the last call (from the DevTools network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def screenshot_views(driver, prefix: str | Path, views: tuple[str, ...] = VIEWS) -> list[Path]:
    """Each shown view of the loaded page as `prefix-<view>.png` (its whole height, the sticky bar kept out)."""
    driver.execute_script("document.querySelector('header.top').style.position = 'static'")
    written = []
    try:
        for view in views:
            box = driver.execute_script(
                "const r = document.getElementById(arguments[0]).getBoundingClientRect();"
                "return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height];",
                f"view-{view}",
            )
            if box[3] <= 0:  # hidden (e.g. "side by side" with one model)
                continue
            clip = {"x": max(0, box[0] - 8), "y": box[1], "width": box[2] + 16, "height": box[3], "scale": 1}
            shot = driver.execute_cdp_cmd(
                "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
            )
            path = Path(f"{prefix}-{view}.png")
            path.write_bytes(base64.b64decode(shot["data"]))
            written.append(path)
    finally:
        driver.execute_script("document.querySelector('header.top').style.position = ''")
    return written
