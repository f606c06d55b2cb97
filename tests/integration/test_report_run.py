"""A real short default run seen from outside: /metrics while it runs, then its trace and
``asyncrl report`` (every picture decoded and non-blank, the page parsed)."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import subprocess
import sys
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest
from matplotlib.image import imread

from asyncrl.runtime.launch.report import write_report
from asyncrl.runtime.scheduler.service.trace import read_trace
from tests.support.cluster import free_port

pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")

from prometheus_client.parser import text_string_to_metric_families

# A whole run, then every picture of it drawn: CI's slow stage.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
BACKENDS = "[jsonl, tensorboard]" if TENSORBOARD else "[jsonl]"
STEPS = 12


def _scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of /metrics, by name and labels, through Prometheus's own parser."""
    with urllib.request.urlopen(url, timeout=2) as reply:
        text = reply.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.headings: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")
        self._in_h2 = tag == "h2"

    def handle_data(self, data: str) -> None:
        if self._in_h2:
            self.headings.append(data)
            self._in_h2 = False


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """The default config for STEPS steps, /metrics scraped until it shows a step, and
    then a report drawn from the run directory while the run goes on."""
    run_dir = tmp_path_factory.mktemp("report") / "run"
    port = free_port()
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c",
            str(REPO / "deploy/configs/default.yaml"), f"run.dir={run_dir}",
            f"run.total_steps={STEPS}", "scheduler.control_port=0", "scheduler.events_port=0",
            f"scheduler.metrics_port={port}", f"logging.backends={BACKENDS}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    scrapes, live_pictures = [], []
    try:
        deadline = time.monotonic() + 150
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                scrape = _scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                scrape = None  # not up yet, or gone
            if scrape and scrape.get("asyncrl_steps_done", {}).get((), 0) >= 1:
                scrapes.append(scrape)
                live_pictures.extend(write_report(run_dir, run_dir / "live-report").pictures)
                break
            time.sleep(0.3)
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out.decode()[-3000:]
    assert live_pictures, "no report was drawn while the run was going"
    return run_dir, scrapes


def test_metrics_are_scraped_from_a_live_run(finished_run: tuple[Path, list[dict]]) -> None:
    _, scrapes = finished_run
    assert scrapes, "no scrape of /metrics showed a train step"
    m = scrapes[-1]
    assert m["asyncrl_total_steps"][()] == STEPS
    assert m["asyncrl_policy_version"][()] >= 0
    assert (("state", "pending"),) in m["asyncrl_groups"]
    assert m["asyncrl_workers"][(("role", "generate"),)] == 1
    assert ("asyncrl_lease_expiries_total" in m) and ("asyncrl_stale_fences_total" in m)
    assert "asyncrl_journal_lag_records" in m and "asyncrl_max_staleness" in m
    assert m["asyncrl_role_tokens_per_second"][(("role", "generate"),)] > 0
    idle = m["asyncrl_role_time_share"][(("bucket", "waiting_for_work"), ("role", "train"))]
    assert 0.0 <= idle <= 1.0


def test_trace_holds_the_required_fields_of_the_event_format(
    finished_run: tuple[Path, list[dict]],
) -> None:
    run_dir, _ = finished_run
    events = read_trace(run_dir / "trace.json")
    for e in events:
        assert {"ph", "ts", "pid", "tid", "name"} <= e.keys(), e
        assert isinstance(e["ts"], int | float) and isinstance(e["pid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], int | float) and e["dur"] >= 0, e
    leases = [e for e in events if e["ph"] == "X" and e.get("cat") == "lease"]
    assert {e["name"] for e in leases} >= {"generate", "logp", "reward", "train"}
    trained = [e for e in leases if e["name"] == "train" and e["args"]["outcome"] == "complete"]
    assert len(trained) == STEPS
    steps = [e["args"]["step"] for e in events if e["ph"] == "i" and e.get("cat") == "train"]
    assert steps == list(range(1, STEPS + 1))
    assert any(e["name"].startswith("loaded v") for e in events)
    assert any(e["name"].startswith("weights v") and e["ph"] == "X" for e in events)
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"generate-0", "train-0"} <= names


def test_report_renders_every_picture_of_a_real_run(
    finished_run: tuple[Path, list[dict]],
) -> None:
    run_dir, _ = finished_run
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "report", str(run_dir)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = _Page()
    page.feed((run_dir / "report" / "index.html").read_text())
    names = {"gantt", "reward", "staleness", "roles", "weights", "response_length", "mismatch"}
    names.add("entropy")  # every step measures it
    names.add("corrections")  # every step says what each part's correction did
    assert {p.stem for p in (run_dir / "report").glob("*.png")} == names
    assert len(page.images) == len(names)
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        pixels = imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])), format="png")
        assert pixels.ndim == 3 and pixels.std() > 0.02  # not a blank canvas
    assert "Lease timeline" in page.headings and "Configuration" in page.headings
    assert "Not in this run directory" not in page.headings
    # Every step says how many tokens it compared with the generator's log-probs; where
    # it compared some, our decoder and the trainer agree to float32's numerics.
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    compared = [s for s in steps if s["logprob_mismatch_tokens"]]
    assert all(s["logprob_mismatch_max"] < 1e-4 for s in compared)
    assert all("logprob_mismatch_mean" not in s for s in steps if s not in compared)


@pytest.mark.skipif(not TENSORBOARD, reason="the tensorboard extra is not installed")
def test_tensorboard_event_file_reads_back(finished_run: tuple[Path, list[dict]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = finished_run
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    rewards = events.Scalars("reward_mean")
    assert [e.step for e in rewards] == list(range(1, STEPS + 1))
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [e.value for e in rewards] == pytest.approx([x["reward_mean"] for x in lines])
    assert "roles.generate.tokens_per_s" in events.Tags()["scalars"]
