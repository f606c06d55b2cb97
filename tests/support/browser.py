"""Pages opened as a reader opens them: Debian's headless Chromium, driven through its
chromedriver by selenium, over HTTP from this machine.

Nothing is installed here: the Debian packages ``chromium`` and ``chromium-driver`` (CI
installs them) and the ``browser`` extra (selenium) are; ``why_no_browser()`` says what
is missing so the tests skip with the reason.

Chromium resolves no host name but 127.0.0.1 (``--host-resolver-rules``), so a page that
needs anything from the internet (a font, a script from a CDN) fails here as it fails on a
machine without a network, even where this one has one.
"""

from __future__ import annotations

import base64
import functools
import http.server
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Chromium", "PageCheck", "serve", "why_no_browser"]

# Chromium refuses to draw a taller screenshot than this (its texture limit).
_MAX_SHOT_PX = 16_000


def why_no_browser() -> str | None:
    """Why these tests cannot run here, or None when they can."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if missing:
        return f"{' and '.join(missing)} not found: apt-get install chromium chromium-driver"
    try:
        import selenium  # noqa: F401 - only to say what to install
    except ImportError:
        return "selenium is not installed: pip install -e '.[browser]'"
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request line per file would bury the test's own output


@contextmanager
def serve(root: Path) -> Iterator[str]:
    """``root`` served over HTTP on 127.0.0.1 for as long as the block runs; its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name=f"http {root}", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@dataclass
class PageCheck:
    """What opening one page showed; ``problems`` is empty for a page that is fine."""

    url: str
    screenshot: Path
    images: int = 0
    diagrams: int = 0
    problems: list[str] = field(default_factory=list)


# Every <img> of the page as [src, complete, naturalWidth]; a lazy image is asked for now,
# since one below the fold would otherwise never load in a screenshot-sized window.
_IMAGES = """
for (const img of document.images) img.loading = "eager";
return Array.from(document.images, i => [i.currentSrc || i.src, i.complete, i.naturalWidth]);
"""

# Mermaid blocks as mkdocs-material leaves them: <pre class="mermaid"> until its script
# replaces each by a <div class="mermaid"> holding the drawing in a closed shadow root.
_DIAGRAMS = """
return [document.querySelectorAll("pre.mermaid").length,
        Array.from(document.querySelectorAll("div.mermaid"),
                   d => d.getBoundingClientRect().height)];
"""


def _asked_by_the_browser(message: str, url: str) -> bool:
    """A failed request the page never made: Chromium asks every HTTP origin for
    /favicon.ico when a page names no icon (as the report, a file meant to be opened
    from disk, does not)."""
    origin = "/".join(url.split("/", 3)[:3])
    return message.startswith(f"{origin}/favicon.ico ")


class Chromium:
    """One headless Chromium for a module's pages; ``check`` opens one page."""

    def __init__(self, width: int = 1280, height: int = 900) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = str(shutil.which("chromium"))
        for arg in (
            "--headless=new",
            "--no-sandbox",  # its sandbox does not start as root, which CI is
            f"--window-size={width},{height}",
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
            "--disable-background-networking",
            "--no-first-run",
        ):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # The system's chromedriver, named: selenium would otherwise look for one to download.
        service = Service(executable_path=str(shutil.which("chromedriver")))
        self.driver = webdriver.Chrome(options=options, service=service)

    def close(self) -> None:
        self.driver.quit()

    def check(
        self, url: str, screenshot: Path, diagrams: int = 0, wait_s: float = 30.0
    ) -> PageCheck:
        """Open ``url``; wait until its pictures are loaded and its ``diagrams`` Mermaid
        blocks drawn (or ``wait_s`` passed); note every console error, every picture not
        drawn and every diagram not drawn; save a screenshot of the whole page."""
        d = self.driver
        d.get(url)
        check = PageCheck(url, screenshot)
        deadline = time.monotonic() + wait_s
        while True:
            images = d.execute_script(_IMAGES)
            pending, drawn = d.execute_script(_DIAGRAMS)
            done = all(complete for _, complete, _ in images) and pending == 0
            if (done and len(drawn) >= diagrams) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        check.images = len(images)
        for src, complete, width in images:
            if not (complete and width > 0):
                shown = src if len(src) < 100 else src[:97] + "..."
                check.problems.append(f"picture not drawn: {shown}")
        check.diagrams = sum(1 for h in drawn if h > 0)
        if pending or len(drawn) != diagrams:
            check.problems.append(
                f"{diagrams} Mermaid diagram(s) in the page, {len(drawn)} drawn after "
                f"{wait_s:.0f} s (the console says why: a diagram that does not parse, or "
                "Mermaid's script not loaded: the site serves it itself, docs/mermaid.sh "
                "fetches it and extra_javascript in docs/mkdocs.yml names it)"
            )
        elif check.diagrams != diagrams or self._svgs_in_diagrams() != diagrams:
            check.problems.append(f"a Mermaid diagram has no drawing: {drawn} px high")
        check.problems.extend(
            f"console {e['level']}: {e['message']}"
            for e in d.get_log("browser")
            if e["level"] == "SEVERE" and not _asked_by_the_browser(e["message"], url)
        )
        self._screenshot(screenshot)
        return check

    def _svgs_in_diagrams(self) -> int:
        """How many div.mermaid hold an <svg>: material draws into closed shadow roots,
        which no page script can enter, so the DevTools protocol's DOM (which pierces
        them) is read."""
        root = self.driver.execute_cdp_cmd("DOM.getDocument", {"depth": -1, "pierce": True})

        def has_svg(node: dict) -> bool:
            kids = node.get("children", []) + node.get("shadowRoots", [])
            return node.get("nodeName", "").lower() == "svg" or any(map(has_svg, kids))

        def walk(node: dict) -> Iterator[dict]:
            yield node
            for kid in node.get("children", []) + node.get("shadowRoots", []):
                yield from walk(kid)

        def is_diagram(node: dict) -> bool:
            attrs = node.get("attributes", [])
            classes = dict(zip(attrs[::2], attrs[1::2], strict=True)).get("class", "")
            return node.get("nodeName") == "DIV" and "mermaid" in classes.split()

        return sum(1 for n in walk(root["root"]) if is_diagram(n) and has_svg(n))

    def _screenshot(self, path: Path) -> None:
        """The whole page, not just the window: the DevTools protocol draws beyond it."""
        size = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "scale": 1}
        clip["height"] = min(size["height"], _MAX_SHOT_PX)
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
