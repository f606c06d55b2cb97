"""The report's entropy: a picture of it per step beside the clipped shares, and its mean
over the first and the last steps among the headline figures."""

from __future__ import annotations

import json
from pathlib import Path


def test_the_entropy_is_plotted_and_its_first_and_last_steps_named(tmp_path: Path) -> None:
    from asyncrl.runtime.launch.report import write_report
    from asyncrl.runtime.launch.report.headline import headline
    from asyncrl.runtime.launch.report.run_files import load_run

    lines = [
        {"step": s, "elapsed_s": s * 0.5, "entropy": 2.0 - s / 10, "clip_frac": 0.1,
         "dual_clip_frac": 0.01}
        for s in range(1, 21)
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = write_report(tmp_path)
    assert "entropy" in {p.stem for p in report.pictures}
    figures = headline(load_run(tmp_path), None)
    # steps 1-10: 1.9 .. 1.0, mean 1.45; steps 11-20: 0.9 .. 0.0, mean 0.45
    assert figures["entropy, first 10 steps (nats/token)"] == "1.450"
    assert figures["entropy, last 10 steps (nats/token)"] == "0.450"


def test_a_run_without_entropy_has_no_picture_of_it(tmp_path: Path) -> None:
    from asyncrl.runtime.launch.report import write_report

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "elapsed_s": 0.5}) + "\n")
    report = write_report(tmp_path)
    assert "entropy" not in {p.stem for p in report.pictures}
    assert "carry no entropy" in report.page.read_text()
