"""A real headless Chromium for tests, driven over the W3C WebDriver protocol by chromedriver
(Debian's `chromium` and `chromium-driver` packages; `make test` installs them where it can).

Only HTTP to chromedriver on loopback (httpx); Chromium runs with every background network
feature off, so nothing tries to reach outside the machine.
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1800"]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference


def missing() -> str | None:
    """Why no browser test can run here, or None when Chromium and chromedriver are installed."""
    if not Path(CHROMIUM).is_file():
        return (f"chromium not found at {CHROMIUM} (install Debian's chromium and chromium-driver: "
                "apt-get install -y chromium chromium-driver)")
    if shutil.which("chromedriver") is None:
        return "chromedriver not found on PATH (apt-get install -y chromium-driver)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One chromedriver process and one Chromium session, with a fresh profile folder."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="agentrl-chromium-")
        port = _free_port()
        self.driver = subprocess.Popen([shutil.which("chromedriver"), f"--port={port}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
        for _ in range(300):  # chromedriver answers /status once it listens
            try:
                if self.http.get("/status").json()["value"]["ready"]:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                time.sleep(0.1)
        caps = {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM, "args": [*FLAGS, f"--user-data-dir={self.profile}"]}}
        self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]

    def _call(self, method: str, path: str, body: dict | None = None):
        r = self.http.request(method, path, json=body)
        value = r.json()["value"]
        if r.status_code >= 400:
            raise RuntimeError(f"webdriver {method} {path}: {value.get('error')}: {value.get('message', '')[:300]}")
        return value

    def _s(self, method: str, path: str, body: dict | None = None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def open(self, url: str) -> None:
        """Load `url` and wait for the page's load event."""
        self._s("POST", "/url", {"url": url})

    def js(self, script: str, *args):
        """The value of `script` (a function body: use `return`) run in the page."""
        return self._s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait(self, script: str, timeout: float = 30.0):
        """Poll `script` until it returns a truthy value (pages render after their scripts run)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(script)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    def click(self, css: str) -> None:
        """Click the first element matching `css`, as a user would (an <option> selects it)."""
        element = self._s("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]
        self._s("POST", f"/element/{element}/click", {})

    def screenshot(self, path: str | Path) -> Path:
        """Save a PNG of the viewport."""
        Path(path).write_bytes(base64.b64decode(self._s("GET", "/screenshot")))
        return Path(path)

    def close(self) -> None:
        """End the session and chromedriver (and the Chromium it started)."""
        try:
            self._s("DELETE", "")
        except (httpx.HTTPError, RuntimeError, ValueError):
            pass
        self.http.close()
        self.driver.terminate()
        try:
            self.driver.wait(10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
