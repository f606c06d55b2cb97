"""The report's validation and evaluation parts, from run directories written here: the
curves per data source and of pass@k (and their absence where a run has nothing for
them), the headline, and the table of ``asyncrl eval`` lines beside the run's own."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from asyncrl.runtime.launch.report import write_report
from asyncrl.runtime.launch.report.headline import headline
from asyncrl.runtime.launch.report.plots import pass_at_k, validation_sources
from asyncrl.runtime.launch.report.run_files import load_run

HOSTILE = "runs/<script>alert('x')</script>&co/final"  # a checkpoint path is user text


def _old(version: int, reward: float) -> dict[str, Any]:
    """A validation line of a run from before sampled validation."""
    return {"version": version, "time": 1.0e9 + version, "worker": "generate-0",
            "val_reward": reward, "val_prompts": 8, "val_reward_errors": 0,
            "val_seconds": 0.5}  # fmt: skip


def _sampled(version: int, base: float) -> dict[str, Any]:
    """A validation line with k = 4 samples per prompt over two data sources."""

    def source(shift: float) -> dict[str, float]:
        return {"reward": base + shift, "best_reward": base + shift + 0.3, "pass@1": base + shift,
                "pass@2": base + shift + 0.1, "pass@4": base + shift + 0.2,
                "response_tokens": 30.0, "prompts": 4}  # fmt: skip

    return {"version": version, "time": 1.0e9 + version, "worker": "generate-0",
            "val_reward": base, "val_best_reward": base + 0.3, "val_pass@1": base,
            "val_pass@2": base + 0.1, "val_pass@4": base + 0.25, "val_response_tokens": 31.5,
            "val_prompts": 8, "val_samples": 4, "val_reward_errors": 0, "val_seconds": 1.0,
            "val_pass_ks": [1, 2, 4], "val_sources": ["gsm8k", "math<b>"],
            "val_by_source": {"gsm8k": source(0.05), "math<b>": source(-0.05)}}  # fmt: skip


def _write(path: Path, lines: list[dict[str, Any]], tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + tail)


def _run_dir(root: Path, validation: list[dict[str, Any]]) -> Path:
    steps = [{"step": s, "elapsed_s": s * 0.5, "policy_version": s - 1, "reward_mean": s / 10}
             for s in range(1, 9)]  # fmt: skip
    _write(root / "metrics.jsonl", steps)
    _write(root / "validation.jsonl", validation, tail='{"version": 9, "val_')  # torn by a kill
    return root


def _sampled_run(root: Path) -> Path:
    return _run_dir(root, [_old(0, 0.1), _old(2, 0.2), _sampled(4, 0.3), _sampled(6, 0.45)])


class _Table(HTMLParser):
    """The rows of the table of evaluations, as lists of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and ("class", "evals") in attrs:
            self._inside = True
        elif self._inside and tag == "tr":
            self.rows.append([])
        elif self._inside and tag in ("td", "th"):
            self.rows[-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._inside = False

    def handle_data(self, data: str) -> None:
        if self._inside and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data.strip()


def _lines(ax: Any) -> dict[str, tuple[list[float], list[float]]]:
    """Each curve of ``ax`` by its label (values rounded: 0.5 + 0.1 is not 0.6 in floats)."""
    return {
        line.get_label(): (
            [float(x) for x in line.get_xdata()],
            [round(float(y), 9) for y in line.get_ydata()],
        )
        for line in ax.get_lines()
    }


def test_each_data_source_and_each_pass_at_j_is_a_curve_against_the_version(
    tmp_path: Path,
) -> None:
    data = load_run(_sampled_run(tmp_path))
    mean, passed = validation_sources(data).axes
    curves = _lines(mean)
    assert list(curves) == ["gsm8k", "math<b>", "all sources"]
    assert curves["gsm8k"] == ([4, 6], [0.35, 0.5])
    assert curves["all sources"] == ([0, 2, 4, 6], [0.1, 0.2, 0.3, 0.45])  # older lines too
    assert _lines(passed)["math<b>"] == ([4, 6], [0.45, 0.6])
    assert _lines(passed)["all sources"] == ([4, 6], [0.55, 0.7])

    by_version, by_j = pass_at_k(data).axes
    curves = _lines(by_version)
    assert list(curves) == ["pass@1", "pass@2", "pass@4", "best of 4", "mean@4"]
    assert curves["pass@4"] == ([4, 6], [0.55, 0.7])
    assert curves["best of 4"] == ([4, 6], [0.6, 0.75])
    assert curves["mean@4"][0] == [0, 2, 4, 6]
    # pass@J against J at the first and the last sampled validation
    assert _lines(by_j) == {"version 4": ([1, 2, 4], [0.3, 0.4, 0.55]),
                            "version 6": ([1, 2, 4], [0.45, 0.55, 0.7])}  # fmt: skip

    report = write_report(tmp_path)
    assert {"reward", "validation_sources", "pass_at_k"} <= {p.stem for p in report.pictures}
    page = report.page.read_text()
    assert "Validation per data source" in page and "Validation mean@k and pass@k" in page


def test_the_headline_gives_the_last_pass_at_k_overall_and_per_source(tmp_path: Path) -> None:
    figures = headline(load_run(_sampled_run(tmp_path)), None)
    assert figures["validation reward, last"] == "0.450 (v6)"
    assert figures["validation mean@4 / pass@4, last"] == "0.450 / 0.700 (v6)"
    assert figures["validation per source (mean@4 / pass@4), last"] == (
        "gsm8k 0.500 / 0.700, math<b> 0.400 / 0.600"
    )
    page = write_report(tmp_path).page.read_text()
    assert "math&lt;b&gt; 0.400" in page and "math<b>" not in page


def test_a_run_with_nothing_per_source_or_sampled_draws_its_reward_as_before(
    tmp_path: Path,
) -> None:
    one_source = {**_old(4, 0.4), "val_samples": 1, "val_pass_ks": [1], "val_pass@1": 0.4,
                  "val_best_reward": 0.4, "val_sources": ["gsm8k"],
                  "val_by_source": {"gsm8k": {"reward": 0.4, "pass@1": 0.4}}}  # fmt: skip
    for name, lines in (("old", [_old(0, 0.1), _old(2, 0.2)]), ("greedy", [one_source])):
        run = _run_dir(tmp_path / name, lines)
        report = write_report(run)
        assert {p.stem for p in report.pictures} == {"reward"}, name
        page = report.page.read_text()
        # left out, not listed as missing: the reward picture holds the one curve there is
        assert "Validation per data source" not in page and "pass@k" not in page, name
        assert not any("validation" in m.lower() for m in report.missing), name
        figures = headline(load_run(run), None)
        assert not any("pass@" in label or "per source" in label for label in figures), name
        assert "Evaluations" not in page  # no eval/ directory: nothing, and nothing missing


def test_each_evaluation_is_tabled_beside_the_runs_validation_of_its_version(
    tmp_path: Path,
) -> None:
    run = _sampled_run(tmp_path)
    at_six = {**_sampled(6, 0.5), "checkpoint": HOSTILE, "samples": 4, "time": 1.7e9 + 60}
    del at_six["worker"]
    unvalidated = {**_old(5, 0.33), "checkpoint": "runs/a/checkpoints/step_5", "version": 5,
                   "samples": 1, "time": 1.7e9}  # fmt: skip
    foreign = {**_old(0, 0.2), "checkpoint": "models/base", "version": None, "samples": 1,
               "time": 1.7e9 + 30}  # fmt: skip
    not_an_eval = {"version": 6, "val_reward": 9.0}  # names no checkpoint
    _write(run / "eval" / "eval.jsonl", [at_six, not_an_eval], tail="{torn")
    _write(run / "eval" / "base" / "eval.jsonl", [foreign, unvalidated])
    (run / "eval" / "samples.jsonl").write_text(json.dumps({"checkpoint": "x"}) + "\n")

    data = load_run(run)
    assert [x["checkpoint"] for x in data.evals] == [
        "runs/a/checkpoints/step_5", "models/base", HOSTILE]  # fmt: skip
    page = write_report(run).page.read_text()
    assert "<script>" not in page
    assert "runs/&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;co/final" in page

    table = _Table()
    table.feed(page)
    blocks: list[list[list[str]]] = []
    for row in table.rows:
        if len(row) == 1:  # a block's heading: the checkpoint and when it was evaluated
            blocks.append([row])
        else:
            blocks[-1].append(row)
    assert [b[0][0] for b in blocks] == [
        "runs/a/checkpoints/step_5 2023-11-14 22:13 UTC",
        "models/base 2023-11-14 22:13 UTC",
        f"{HOSTILE} 2023-11-14 22:14 UTC",
    ]
    assert blocks[0][1] == ["", "eval", "run's validation (none at v5)"]
    assert blocks[1][1] == ["", "eval", "run's validation (version unknown)"]
    rows = {row[0]: row[1:] for row in blocks[2][1:]}
    assert rows.pop("") == ["eval", "run's validation (v6)"]
    assert rows == {
        "policy version": ["6", "6"],
        "samples per prompt (k)": ["4", "4"],
        "mean@4 (mean reward)": ["0.500", "0.450"],
        "pass@1": ["0.500", "0.450"],
        "pass@2": ["0.600", "0.550"],
        "pass@4": ["0.750", "0.700"],
        "best of 4 (mean)": ["0.800", "0.750"],
        "response tokens (mean)": ["31.5", "31.5"],
        "prompts": ["8", "8"],
        "gsm8k: mean@4": ["0.550", "0.500"],
        "gsm8k: pass@4": ["0.750", "0.700"],
        "math<b>: mean@4": ["0.450", "0.400"],
        "math<b>: pass@4": ["0.650", "0.600"],
    }
    old = {row[0]: row[1:] for row in blocks[0][2:]}
    assert old["mean@1 (mean reward)"] == ["0.330", ""]
    assert old["samples per prompt (k)"] == ["1", ""]
