"""The report's pieces: the timeline from a trace, the overlap figure, a run dir that
lacks files, and what `asyncrl run` checks before it starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.runtime.contract.config import load_config
from asyncrl.runtime.contract.extras import missing_extras
from asyncrl.runtime.launch.progress import estimate_eta, progress_line
from asyncrl.runtime.launch.report.timeline import busy_overlap, timeline_from_trace


def _x(name: str, ts: float, dur: float, tid: int, pid: int, cat: str = "lease") -> dict:
    return {"name": name, "cat": cat, "ph": "X", "ts": ts * 1e6, "dur": dur * 1e6,
            "pid": pid, "tid": tid, "args": {"outcome": "complete"}}  # fmt: skip


def _meta(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": name}}


def test_timeline_rows_follow_the_data_flow_and_bars_their_worker() -> None:
    events = [
        _meta("process_name", 1, 0, "train"), _meta("thread_name", 1, 1, "train-0"),
        _meta("process_name", 2, 0, "generate"), _meta("thread_name", 2, 2, "generate-10"),
        _meta("thread_name", 2, 3, "generate-9"),
        _x("train", 100.0, 1.0, 1, 1), _x("generate", 100.5, 2.0, 2, 2),
        _x("generate", 101.0, 0.5, 3, 2), _x("weights v1", 101.0, 0.1, 3, 2, cat="weights"),
        {"name": "step 1", "cat": "train", "ph": "i", "s": "g", "ts": 101e6, "pid": 0,
         "tid": 0, "args": {"step": 1}},
    ]  # fmt: skip
    t = timeline_from_trace(events)
    assert t.rows == [("generate", "generate-9"), ("generate", "generate-10"), ("train", "train-0")]
    assert t.leases["train-0"][0].start == 0.0 and t.leases["train-0"][0].end == 1.0
    assert len(t.weights["generate-9"]) == 1 and t.steps == [(1.0, 1)]
    assert t.span == 2.5
    # Generation ran during half of the training time.
    assert busy_overlap(t.role_intervals("train"), t.role_intervals("generate")) == 0.5


def test_overlap_of_disjoint_and_nested_intervals() -> None:
    assert busy_overlap([(0, 1)], [(2, 3)]) == 0.0
    assert busy_overlap([(0, 4)], [(1, 2), (1.5, 3)]) == 0.5
    assert busy_overlap([], [(0, 1)]) is None


def test_an_older_run_dir_is_reported_with_what_it_lacks(tmp_path: Path) -> None:
    from asyncrl.runtime.launch.report import write_report

    lines = [{"step": s, "elapsed_s": s * 0.5, "policy_version": s - 1, "reward_mean": s / 10,
              "staleness_mean": 1.0, "staleness_max": 2, "response_len_mean": 10 + s,
              "response_len_max": 20} for s in range(1, 13)]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"st')
    report = write_report(tmp_path)
    page = report.page.read_text()
    assert {p.stem for p in report.pictures} == {"reward", "staleness", "response_length"}
    for lacking in ("trace.json", "validation.jsonl", "weights.jsonl", "config.yaml"):
        assert any(m.startswith(lacking) for m in report.missing), lacking
        assert lacking in page
    assert "no lease timeline" in page


def test_the_log_prob_gap_is_plotted_per_step_and_its_widest_named(tmp_path: Path) -> None:
    from asyncrl.runtime.launch.report import write_report
    from asyncrl.runtime.launch.report.headline import headline
    from asyncrl.runtime.launch.report.run_files import load_run

    def line(s: int) -> dict:
        if s % 3 == 0:  # logp reused the generator's log-probs: nothing compared
            return {"step": s, "elapsed_s": s * 0.5, "logprob_mismatch_tokens": 0}
        return {"step": s, "elapsed_s": s * 0.5, "logprob_mismatch_tokens": 40,
                "logprob_mismatch_mean": 1e-7 * s, "logprob_mismatch_max": 1e-6 * s,
                "logprob_mismatch_kl": 1e-14 * s}  # fmt: skip

    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(line(s)) + "\n" for s in range(1, 7))
    )
    report = write_report(tmp_path)
    assert "mismatch" in {p.stem for p in report.pictures}
    figures = headline(load_run(tmp_path), None)
    assert figures["generator-trainer log-prob gap, max"] == "5.00e-06 (160 tokens in 4 steps)"
    # A run that compared nothing still draws the counts (all 0), and names no gap.
    (tmp_path / "metrics.jsonl").write_text(json.dumps(line(3)) + "\n")
    assert "mismatch" in {p.stem for p in write_report(tmp_path).pictures}
    assert not any("gap" in label for label in headline(load_run(tmp_path), None))


def test_the_corrections_are_plotted_and_their_means_headlined(tmp_path: Path) -> None:
    from asyncrl.runtime.launch.report import write_report
    from asyncrl.runtime.launch.report.headline import headline
    from asyncrl.runtime.launch.report.run_files import load_run

    def line(s: int) -> dict:
        # steps 1 and 2: engine masked 0.1 and 0.3 (mean 0.2), one sequence in 8 rejected
        # at step 2 (mean 0.0625); the log-ppl gap -1e-3 and +3e-3 (mean +1e-3)
        return {"step": s, "elapsed_s": s * 0.5, "logprob_mismatch_tokens": 40,
                "logprob_mismatch_mean": 1e-3, "logprob_mismatch_max": 1e-2,
                "logprob_mismatch_kl": 1e-6, "logprob_mismatch_log_ppl": -1e-3 if s == 1 else 3e-3,
                "offpolicy_weight_mean": 1.0, "offpolicy_weight_max": 2.0,
                "offpolicy_truncated_frac": 0.0, "offpolicy_masked_frac": 0.0,
                "offpolicy_rejected_frac": 0.0, "engine_weight_mean": 1.5 * s,
                "engine_weight_max": 4.0, "engine_truncated_frac": 0.01 * s,
                "engine_masked_frac": 0.1 if s == 1 else 0.3,
                "engine_rejected_frac": 0.0 if s == 1 else 0.125}  # fmt: skip

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line(s)) + "\n" for s in (1, 2)))
    assert "corrections" in {p.stem for p in write_report(tmp_path).pictures}
    figures = headline(load_run(tmp_path), None)
    assert figures["log-perplexity gap (trainer - generator), mean"] == "+1.00e-03"
    assert figures["engine correction, mean per step"] == (
        "weight 2.250 before truncation, 1.50% of tokens truncated, 20.00% masked, "
        "6.25% of sequences rejected"
    )


def test_a_backend_or_endpoint_whose_package_is_missing_is_named_before_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = load_config(None, ["logging.backends=[jsonl, tensorboard]", "scheduler.metrics_port=9"])
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    lines = missing_extras(cfg)
    assert lines == [
        "logging.backends has tensorboard, but tensorboard is not installed: "
        "pip install 'asyncrl[tensorboard]'",
        "scheduler.metrics_port is set, but prometheus_client is not installed: "
        "pip install 'asyncrl[metrics]'",
    ]
    assert missing_extras(load_config(None, [])) == []


def test_the_progress_line_shows_an_eta_at_the_pace_since_the_first_step_seen() -> None:
    assert estimate_eta((2, 10.0), (12, 20.0), 112) == 100.0
    assert estimate_eta((2, 10.0), (2, 20.0), 112) is None
    line = progress_line({"step": 12}, 112, 30.0, 100.0)
    assert line.endswith("ETA 1m40s")
    assert "ETA" not in progress_line({"step": 112}, 112, 30.0, 0.0)


def test_a_resumed_run_s_time_axis_joins_the_schedulers_lifetimes(tmp_path: Path) -> None:
    from asyncrl.runtime.launch.report.run_files import load_run

    times = [(1, 5.0), (2, 6.0), (3, 2.0), (4, 3.0)]  # resumed after step 2
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "elapsed_s": t}) + "\n" for s, t in times)
    )
    vals = [(0, 4.0), (2, 1.5)]
    (tmp_path / "validation.jsonl").write_text(
        "".join(json.dumps({"version": v, "elapsed_s": t}) + "\n" for v, t in vals)
    )
    data = load_run(tmp_path)
    assert [x["run_s"] for x in data.steps] == [5.0, 6.0, 8.0, 9.0]
    assert [x["run_s"] for x in data.validation] == [4.0, 7.5]


def test_asyncrl_run_refuses_at_once_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from asyncrl.runtime.launch.cli.main import main

    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    run_dir = tmp_path / "run"
    assert main(["run", "logging.backends=[wandb]", f"run.dir={run_dir}"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "asyncrl: error: logging.backends has wandb, but wandb is not installed: "
        "pip install 'asyncrl[wandb]'\n"
    )
    assert not run_dir.exists()  # nothing was started


def test_a_critic_staleness_is_in_the_headline_only_where_the_lines_carry_it(tmp_path) -> None:
    from asyncrl.runtime.contract.rundir import RunDir
    from asyncrl.runtime.launch.report.headline import headline
    from asyncrl.runtime.launch.report.run_files import RunData

    lines = [{"step": 1, "staleness_mean": 1.0}, {"step": 2, "staleness_mean": 2.0}]
    plain = headline(RunData(RunDir(tmp_path), steps=lines), None)
    assert "critic staleness, mean" not in plain
    with_critic = [{**line, "critic_staleness_mean": line["step"] * 1.0} for line in lines]
    out = headline(RunData(RunDir(tmp_path), steps=with_critic), None)
    assert out["critic staleness, mean"] == "1.500"


def test_the_headline_counts_every_group_created_in_its_state(tmp_path: Path) -> None:
    from asyncrl.runtime.contract.rundir import RunDir
    from asyncrl.runtime.launch.report.headline import headline
    from asyncrl.runtime.launch.report.run_files import RunData

    groups = {"pending": 8, "trained": 480, "superseded": 160}
    last = {"step": 30, "group_states": groups, "groups_created": 648}
    out = headline(RunData(RunDir(tmp_path), steps=[{"step": 29}, last]), None)
    assert (
        out["groups at the last step"] == "pending 8, trained 480, superseded 160 (of 648 created)"
    )
    assert "groups at the last step" not in headline(
        RunData(RunDir(tmp_path), steps=[{"step": 1}]), None
    )
