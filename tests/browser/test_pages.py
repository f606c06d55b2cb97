"""The pages a person reads, opened in a real browser (headless Chromium): every page of
the docs site as ``mkdocs build --strict`` makes it, and the page ``asyncrl report`` draws
for a real run. Each loads with no console error, every picture drawn and every Mermaid
diagram drawn; a screenshot of each is kept (CI keeps them as artifacts).

Run with ``python -m pytest -m browser`` (the docs and browser extras, and Debian's
chromium and chromium-driver: see tests/support/browser.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import default_run
from tests.support.browser import Chromium, PageCheck, serve, why_no_browser

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(900),
    pytest.mark.skipif(why_no_browser() is not None, reason=str(why_no_browser())),
]

REPO = Path(__file__).resolve().parents[2]
DOCS_CONFIG = REPO / "docs" / "mkdocs.yml"
CLI = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main"]


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """$ASYNCRL_ARTIFACTS/screenshots where CI keeps its artifacts, else a temporary one."""
    artifacts = os.environ.get("ASYNCRL_ARTIFACTS")
    if not artifacts:
        return tmp_path_factory.mktemp("screenshots")
    folder = Path(artifacts).resolve() / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    browser = Chromium()
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site, built as CI builds it, into a folder of the test's own."""
    pytest.importorskip("mkdocs", reason="no mkdocs: pip install -e '.[docs]'")
    if not DOCS_CONFIG.is_file():
        pytest.fail(f"{DOCS_CONFIG} is missing: the docs site is built from it")
    out = tmp_path_factory.mktemp("site")
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(DOCS_CONFIG)]
    done = subprocess.run(
        [*argv, "-d", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stderr[-6000:]}"
    return out


def _diagrams_in(html: str) -> int:
    """Mermaid blocks as the build wrote them (pymdownx.superfences' custom fence)."""
    return len(re.findall(r'<pre class="mermaid"', html))


def _url_path(page: Path, root: Path) -> str:
    """A page's URL as the site's own links name it: a folder for its index.html."""
    rel = page.relative_to(root).as_posix()
    return rel.removesuffix("index.html") if rel.endswith("index.html") else rel


def _shot_name(prefix: str, url_path: str) -> str:
    return prefix + "-" + (re.sub(r"[^A-Za-z0-9.]+", "-", url_path).strip("-") or "home") + ".png"


def _verdict(checks: list[PageCheck]) -> str:
    bad = [c for c in checks if c.problems]
    return "\n".join(f"{c.url}:\n  " + "\n  ".join(c.problems) for c in bad)


def test_every_docs_page_loads_with_its_pictures_and_diagrams_drawn(
    site: Path, chromium: Chromium, screenshots: Path
) -> None:
    pages = sorted(site.rglob("*.html"))
    assert (site / "index.html") in pages, f"the site has no front page: {site}"
    checks = []
    with serve(site) as base:
        for page in pages:
            path = _url_path(page, site)
            diagrams = _diagrams_in(page.read_text(encoding="utf-8"))
            shot = screenshots / _shot_name("docs", path)
            checks.append(chromium.check(base + path, shot, diagrams=diagrams))
    if _verdict(checks):
        pytest.fail(_verdict(checks), pytrace=False)
    assert all(c.screenshot.stat().st_size > 0 for c in checks)


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``asyncrl report`` of a real short default run (the embedded model, on CPU)."""
    run_dir = tmp_path_factory.mktemp("report") / "run"
    log = run_dir.parent / "run.log"
    proc = default_run.start(run_dir, log, "run.total_steps=6")
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-4000:]
    done = subprocess.run(
        [*CLI, "report", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return run_dir / "report"


def test_the_report_page_of_a_real_run_loads_with_every_picture_drawn(
    report_dir: Path, chromium: Chromium, screenshots: Path
) -> None:
    pictures = sorted(p.stem for p in report_dir.glob("*.png"))
    assert pictures, f"asyncrl report drew nothing into {report_dir}"
    with serve(report_dir) as base:
        check = chromium.check(base + "index.html", screenshots / "report.png")
    if check.problems:
        pytest.fail(_verdict([check]), pytrace=False)
    assert check.images == len(pictures), (check.images, pictures)
    assert check.screenshot.stat().st_size > 0
