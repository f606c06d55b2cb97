"""The report's samples section: the best and the worst sample of each step range of a run
directory's rollout dumps, every value escaped (model output is untrusted text)."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.runtime.contract.rollout_dumps import FORMAT_VERSION, append_lines, steps_file
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.launch.report.samples import SHORTENED, samples_html, step_ranges


def _line(step: int, gid: int, reward: float, response: str, **more) -> dict:
    return {
        **{"v": FORMAT_VERSION, "kind": "trained", "step": step, "gid": gid, "row": 0},
        **{"trainer_start": 1, "resumed_at": 0, "prompt": f"{gid}+{gid}=", "response": response},
        **{"reward": reward, "reward_parts": {"task": reward}, "advantage": reward - 0.5},
        **more,
    }


def _run_dir(tmp_path: Path, steps: int = 20) -> RunDir:
    run = RunDir(tmp_path)
    for step in range(1, steps + 1):
        lines = [_line(step, 10 * step + g, (step * 7 + g * 3) % 10 / 10, f"r{step}.{g}")
                 for g in range(4)]  # fmt: skip
        append_lines(steps_file(run.rollouts, step), lines)
    return run


def test_steps_split_into_equal_ranges() -> None:
    assert step_ranges(list(range(1, 21))) == [(1, 4), (5, 8), (9, 12), (13, 16), (17, 20)]
    assert step_ranges([1, 2]) == [(1, 1), (2, 2)]
    assert step_ranges([3, 40], ranges=5) == [(3, 10), (35, 40)]  # empty spans left out
    assert step_ranges([]) == []


def test_each_range_shows_its_best_and_worst_sample(tmp_path: Path) -> None:
    from asyncrl.runtime.contract.rollout_dumps import read_rollouts

    run = _run_dir(tmp_path)
    page = samples_html(read_rollouts(run.rollouts))
    assert page.count("<td>best</td>") == page.count("<td>worst</td>") == 5
    for start, end in step_ranges(list(range(1, 21))):
        lines = [
            (float((s * 7 + g * 3) % 10 / 10), f"r{s}.{g}")
            for s in range(start, end + 1)
            for g in range(4)
        ]
        top, bottom = max(r for r, _ in lines), min(r for r, _ in lines)
        best = [text for r, text in lines if r == top][-1]  # a tie: the later sample
        worst = next(text for r, text in lines if r == bottom)  # a tie: the earlier
        assert f"<td><pre>{best}</pre></td></tr>" in page
        assert f"<td><pre>{worst}</pre></td></tr>" in page
    assert "80 trained samples dumped over 20 steps" in page


def test_model_output_is_escaped_and_shortened(tmp_path: Path) -> None:
    from asyncrl.runtime.contract.rollout_dumps import read_rollouts

    run = RunDir(tmp_path)
    evil = "<script>alert('x')</script>" + "&" * (2 * SHORTENED)
    lines = [
        _line(1, 1, 1.0, evil, prompt="<img src=x onerror=alert(1)>", truncated=True),
        _line(1, 2, 0.0, "fine", reward_parts={"<b>task</b>": 0.0}),
    ]
    append_lines(steps_file(run.rollouts, 1), lines)
    page = samples_html(read_rollouts(run.rollouts))
    assert "<script>" not in page and "<img" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert f"({len(evil)} characters) [truncated]" in page
    assert page.count("&amp;") < 2 * SHORTENED


def test_the_report_page_has_the_samples_of_a_run_that_dumped_them(tmp_path: Path) -> None:
    from asyncrl.runtime.launch.report import write_report

    run = _run_dir(tmp_path, steps=3)
    append_lines(steps_file(run.rollouts, 3), [_line(3, 99, 2.0, "</pre><script>x()</script>")])
    with steps_file(run.rollouts, 3).open("a") as file:
        file.write('{"v": 1, "kind": "trained", "st')  # torn by a kill
    filtered = {**_line(0, 7, 1.0, "7"), "kind": "filtered", "filtered": "all <1.0>"}
    append_lines(run.rollouts / "filtered-reward-0-1.jsonl", [filtered])
    metrics = [{"step": s, "reward_mean": 0.5} for s in (1, 2, 3)]
    run.metrics.write_text("".join(json.dumps(m) + "\n" for m in metrics))
    page = write_report(tmp_path).page.read_text()
    section = page[page.index("<h2>Samples</h2>") :]
    assert "<script>" not in page
    assert "&lt;/pre&gt;&lt;script&gt;x()&lt;/script&gt;" in section  # step 3's best
    assert "1 groups filtered out (1 samples)" in section and "all &lt;1.0&gt;" in section
    assert "1 lines skipped" in section


def test_a_run_without_dumps_has_no_samples_section(tmp_path: Path) -> None:
    from asyncrl.runtime.launch.report import write_report

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    report = write_report(tmp_path)
    assert "<h2>Samples</h2>" not in report.page.read_text()
    assert not any("rollouts" in m for m in report.missing)
    (tmp_path / "config.yaml").write_text("run:\n  dump_rollouts: true\n")
    assert any(m.startswith("rollouts/") for m in write_report(tmp_path).missing)
