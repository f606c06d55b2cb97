"""The supervisor behind `asyncrl run`, with real child processes (small `python -c` scripts).

Children report their pid by writing a file; whether a pid is still alive is read from /proc
(a zombie counts as gone: nothing runs, and an orphan's reaper may be slow to collect it).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncrl.runtime.contract.child_status import STOPS_THE_RUN
from asyncrl.runtime.launch import ChildSpec, OnEvent, Supervisor
from asyncrl.runtime.launch._backoff import Backoff

pytestmark = pytest.mark.timeout(60)

# Writes "pid sid" to argv[1] (atomically, so a reader never sees half), then sleeps.
SLEEPER = """
import os, pathlib, sys, time
path = pathlib.Path(sys.argv[1])
tmp = path.with_suffix(".tmp")
tmp.write_text(f"{os.getpid()} {os.getsid(0)}")
tmp.rename(path)
time.sleep(60)
"""
# Like SLEEPER, but ignores SIGTERM first.
STUBBORN = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + SLEEPER
# Exits with code argv[1] once every file in argv[2:] exists.
WAITER = """
import pathlib, sys, time
paths = [pathlib.Path(p) for p in sys.argv[2:]]
deadline = time.monotonic() + 20
while not all(p.exists() for p in paths) and time.monotonic() < deadline:
    time.sleep(0.02)
sys.exit(int(sys.argv[1]))
"""
# Appends a line to argv[1], says so on stdout and stderr, and exits 1.
CRASHER = """
import sys
with open(sys.argv[1], "a") as f:
    f.write("start\\n")
print("out: starting")
print("err: crashing", file=sys.stderr)
sys.exit(1)
"""
# Fails at once with one reason: argv[2] "same" each time, "count": the start's number.
QUIET_CRASHER = """
import sys
with open(sys.argv[1], "a") as f:
    f.write("start\\n")
n = open(sys.argv[1]).read().count("start")
why = sys.argv[2] if sys.argv[2] == "same" else str(n)
raise SystemExit("RuntimeError: cannot start: " + why)
"""
# Runs a Supervisor in its own process, as `asyncrl run` would; config is JSON in argv[1].
DRIVER = """
import json, sys
from pathlib import Path
from typing import Any
from asyncrl.runtime.launch import ChildSpec, Supervisor
config = json.loads(sys.argv[1])
specs = [ChildSpec(**spec) for spec in config["specs"]]
sys.exit(Supervisor(specs, Path(config["log_dir"]), stop_grace_s=config["grace_s"]).run())
"""


def py(script: str, *args: object) -> list[str]:
    """A child's command line. -I -S: the scripts need only the standard library, and skipping
    site-packages' .pth files makes a start several times faster."""
    return [sys.executable, "-I", "-S", "-c", script, *map(str, args)]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    state = stat.rpartition(")")[2].split()[0]  # the name, in parentheses, may hold spaces
    return state not in ("Z", "X")


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def pid_of(path: Path) -> int:
    wait_until(path.exists)
    return int(path.read_text().split()[0])


class Recorder:
    """An `on_event` that keeps every event, for the tests to read back."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def __call__(self, kind: str, fields: dict[str, object]) -> None:
        self.events.append((kind, fields))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    def of(self, kind: str, name: str | None = None) -> list[dict[str, object]]:
        return [f for k, f in self.events if k == kind and name in (None, f.get("name"))]


def supervise(tmp_path: Path, specs: list[ChildSpec], **options: Any) -> tuple[int, Recorder]:
    recorder = Recorder()
    supervisor = Supervisor(specs, tmp_path / "logs", on_event=recorder, **options)
    return supervisor.run(), recorder


@pytest.mark.parametrize("code", [0, 3])
def test_the_primary_exiting_ends_the_run_and_stops_the_workers(tmp_path: Path, code: int) -> None:
    pid_files = [tmp_path / "w0.pid", tmp_path / "w1.pid"]
    specs = [
        ChildSpec("scheduler", py(WAITER, code, *pid_files), restart=False),
        ChildSpec("generate-0", py(SLEEPER, pid_files[0]), restart=True),
        ChildSpec("generate-1", py(SLEEPER, pid_files[1]), restart=True),
    ]
    status, events = supervise(tmp_path, specs, stop_grace_s=5)

    assert status == code
    for path in pid_files:
        pid, sid = map(int, path.read_text().split())
        assert not alive(pid)
        assert sid == pid  # each child leads its own session, away from the terminal's Ctrl-C
    assert [f["code"] for f in events.of("exited", "scheduler")] == [code]
    assert [f["signal"] for f in events.of("exited") if "signal" in f] == ["SIGTERM", "SIGTERM"]
    assert events.of("restarting") == []
    assert events.kinds()[-1] == "done"
    assert events.of("done") == [{"code": code}]


# Exits 0 once argv[1] exists plus a second: a worker finishing its way out of a run.
LEAVER = """
import pathlib, sys, time
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.02)
time.sleep(1.0)
"""


def test_workers_leaving_a_finished_run_are_let_finish_before_any_sigterm(tmp_path: Path) -> None:
    go = tmp_path / "go"
    specs = [
        ChildSpec(
            "scheduler", py(f"import pathlib; pathlib.Path({str(go)!r}).touch()"), restart=False
        ),
        ChildSpec("train-0", py(LEAVER, go), restart=True),
    ]
    status, events = supervise(tmp_path, specs, stop_grace_s=5)

    assert status == 0
    assert [f.get("code") for f in events.of("exited", "train-0")] == [0]
    assert [f for f in events.of("exited") if "signal" in f] == []


def test_a_crashing_worker_is_restarted_with_a_doubling_backoff(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    specs = [
        ChildSpec("scheduler", py(WAITER, 0, tmp_path / "enough"), restart=False),
        ChildSpec("generate-0", py(CRASHER, starts), restart=True),
    ]
    recorder = Recorder()

    def on_event(kind: str, fields: dict[str, object]) -> None:
        recorder(kind, fields)
        if kind == "restarting" and fields["restart"] == 4:
            (tmp_path / "enough").touch()

    status = Supervisor(
        specs,
        tmp_path / "logs",
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        crash_loop_starts=100,  # it fails the same way each time: not what is tested here
        on_event=on_event,
    ).run()

    assert status == 0
    delays = [f["delay_s"] for f in recorder.of("restarting")]
    assert delays[:4] == [0.05, 0.1, 0.2, 0.2]
    assert starts.read_text().count("start") >= 4
    log = (tmp_path / "logs" / "generate-0.log").read_text()
    assert log.count("out: starting") >= 4  # every run's output appended to the one file
    assert log.count("err: crashing") >= 4


def test_backoff_starts_over_once_a_child_was_healthy() -> None:
    backoff = Backoff(initial_s=0.5, max_s=3.0, healthy_after_s=30.0)
    assert [backoff.delay_after(1.0) for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.delay_after(30.0) == 0.5
    assert backoff.delay_after(0.1) == 1.0
    backoff.came_up()  # it said it was up before it failed: no crash loop, no waiting
    assert backoff.delay_after(0.1) == 0.5


def test_a_worker_past_max_restarts_ends_the_run_with_status_1(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    specs = [
        ChildSpec("scheduler", py("import time; time.sleep(60)"), restart=False),
        ChildSpec("generate-0", py(CRASHER, starts), restart=True),
    ]
    status, events = supervise(
        tmp_path, specs, backoff_initial_s=0.01, max_restarts=2, crash_loop_starts=100
    )

    assert status == 1
    assert starts.read_text().count("start") == 3  # the first run and two restarts
    assert events.of("gave_up") == [{"name": "generate-0", "restarts": 2, "max_restarts": 2}]
    assert events.of("exited", "scheduler")[0]["signal"] == "SIGTERM"


def test_a_worker_failing_the_same_way_on_every_start_ends_the_run_with_why(
    tmp_path: Path,
) -> None:
    starts = tmp_path / "starts"
    specs = [
        ChildSpec("scheduler", py("import time; time.sleep(60)"), restart=False),
        ChildSpec("generate-0", py(QUIET_CRASHER, starts, "same"), restart=True),
    ]
    status, events = supervise(tmp_path, specs, backoff_initial_s=0.01)

    assert status == 1
    assert starts.read_text().count("start") == 3
    assert events.of("failing") == [
        {"name": "generate-0", "starts": 3, "reason": "RuntimeError: cannot start: same"}
    ]


def test_a_worker_failing_differently_each_start_is_still_restarted(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    specs = [
        ChildSpec("scheduler", py(WAITER, 0, tmp_path / "enough"), restart=False),
        ChildSpec("generate-0", py(QUIET_CRASHER, starts, "count"), restart=True),
    ]
    recorder = Recorder()

    def on_event(kind: str, fields: dict[str, object]) -> None:
        recorder(kind, fields)
        if kind == "restarting" and fields["restart"] == 5:
            (tmp_path / "enough").touch()

    status = Supervisor(
        specs, tmp_path / "logs", backoff_initial_s=0.01, backoff_max_s=0.02, on_event=on_event
    ).run()

    assert status == 0
    assert recorder.of("failing") == []
    assert starts.read_text().count("start") >= 5


# A worker that says how far its start got (runtime/contract/child_status.py), following a
# plan of one step a start (argv[2:]; the last step repeats): "fail R" fails to start for
# R; "slow R" too, after 0.3 s; "up R" comes up, then fails for R before any work; "work R"
# comes up, works, then fails for R; "kill" comes up, then dies by SIGKILL; "early-kill"
# dies by SIGKILL before it is up; "done" comes up, exits 0.
PLANNED = """
import os, signal, sys, time
with open(sys.argv[1], "a+") as starts:
    starts.write("start\\n")
    starts.seek(0)
    n = len(starts.read().splitlines())
plan = sys.argv[2:]
what, _, reason = plan[min(n, len(plan)) - 1].partition(" ")
def note(line):
    with open(os.environ["ASYNCRL_STATUS_FILE"], "a") as status:
        status.write(line + "\\n")
note("starting")
if what == "slow":
    time.sleep(0.3)
if what in ("up", "work", "kill", "done"):
    note("up")
if what == "work":
    note("working")
if what == "done":
    sys.exit(0)
if what in ("kill", "early-kill"):
    os.kill(os.getpid(), signal.SIGKILL)
note("failed " + reason)
sys.exit(1)
"""
# Says why it fails on its first start only, then exits 1 without a word.
WORDS_ONCE = """
import sys
with open(sys.argv[1], "a") as f:
    f.write("start\\n")
if open(sys.argv[1]).read().count("start") == 1:
    print("boom")
sys.exit(1)
"""


def planned(tmp_path: Path, *plan: str) -> list[ChildSpec]:
    return [
        ChildSpec("scheduler", py(WAITER, 0, tmp_path / "enough"), restart=False),
        ChildSpec("generate-0", py(PLANNED, tmp_path / "starts", *plan), restart=True),
    ]


def starts_of(tmp_path: Path) -> int:
    return (tmp_path / "starts").read_text().count("start")


def enough_after(tmp_path: Path, restarts: int, recorder: Recorder) -> OnEvent:
    """An on_event that ends the run (the primary exits 0) after ``restarts`` restarts."""

    def on_event(kind: str, fields: dict[str, object]) -> None:
        recorder(kind, fields)
        if kind == "restarting" and fields["restart"] == restarts:
            (tmp_path / "enough").touch()

    return on_event


FAST = {"backoff_initial_s": 0.01, "backoff_max_s": 0.02}


def test_a_worker_killed_after_it_came_up_is_restarted_every_time(tmp_path: Path) -> None:
    # Each lives far less than healthy_after_s, and its log says nothing: only its "up"
    # tells a kill -9 of a running worker from a failure to start.
    recorder = Recorder()
    on_event = enough_after(tmp_path, 5, recorder)
    status = Supervisor(
        planned(tmp_path, "kill"), tmp_path / "logs", **FAST, on_event=on_event
    ).run()

    assert status == 0
    assert recorder.of("failing") == []
    assert starts_of(tmp_path) >= 5
    assert {f.get("signal") for f in recorder.of("exited", "generate-0")} == {"SIGKILL"}
    # Each came up before it was killed: restarted without the doubling delay.
    delays = {r["delay_s"] for r in recorder.of("restarting", "generate-0")}
    assert delays == {FAST["backoff_initial_s"]}, delays


def test_a_start_that_fails_the_same_way_after_healthy_after_s_is_a_crash_loop(
    tmp_path: Path,
) -> None:
    # A large model loads for longer than healthy_after_s before the failure that recurs.
    specs = planned(tmp_path, "slow model.path: no weights")
    status, events = supervise(tmp_path, specs, **FAST, healthy_after_s=0.1, max_restarts=5)

    assert status == 1
    assert events.of("gave_up") == []
    assert events.of("failing") == [
        {"name": "generate-0", "starts": 3, "reason": "model.path: no weights"}
    ]
    assert starts_of(tmp_path) == 3


def test_the_count_starts_over_when_a_worker_came_up_or_failed_otherwise(
    tmp_path: Path,
) -> None:
    plan = ["fail a", "fail a", "work a", "fail a", "up a", "fail b", "fail a", "up a"]
    plan += ["fail a"]
    status, events = supervise(tmp_path, planned(tmp_path, *plan), **FAST)

    assert status == 1
    assert starts_of(tmp_path) == len(plan)
    assert events.of("failing") == [{"name": "generate-0", "starts": 3, "reason": "a"}]


def test_a_worker_failing_at_its_first_work_after_each_start_is_a_crash_loop(
    tmp_path: Path,
) -> None:
    # Up on every start (a training group loads), failing at its first lease (the update
    # breaks): restarted at once each time, it would go round for ever.
    status, events = supervise(tmp_path, planned(tmp_path, "up update broke"), **FAST)

    assert status == 1
    assert starts_of(tmp_path) == 3
    assert events.of("failing") == [{"name": "generate-0", "starts": 3, "reason": "update broke"}]


def test_a_worker_killed_before_it_came_up_each_time_is_a_crash_loop(tmp_path: Path) -> None:
    # The OOM killer at every model load: no words, the same signal.
    status, events = supervise(tmp_path, planned(tmp_path, "early-kill"), **FAST)

    assert status == 1
    assert events.of("failing") == [
        {"name": "generate-0", "starts": 3, "reason": "ended by SIGKILL"}
    ]


def test_a_silent_start_is_not_given_an_earlier_starts_words(tmp_path: Path) -> None:
    specs = [
        ChildSpec("scheduler", py("import time; time.sleep(60)"), restart=False),
        ChildSpec("generate-0", py(WORDS_ONCE, tmp_path / "starts"), restart=True),
    ]
    status, events = supervise(tmp_path, specs, **FAST)

    assert status == 1
    assert starts_of(tmp_path) == 4  # "boom", then three in a row without a word
    assert events.of("failing") == [{"name": "generate-0", "starts": 3, "reason": "exit code 1"}]


def test_a_primary_killed_after_it_came_up_is_resumed_every_time(tmp_path: Path) -> None:
    # The scheduler under asyncrl run: kill -9 soon after each resume is no crash loop.
    plan = py(PLANNED, tmp_path / "starts", "kill", "kill", "kill", "kill", "done")
    specs = [
        ChildSpec("scheduler", plan, restart=False, resume_argv=plan),
        ChildSpec("generate-0", py("import time; time.sleep(60)"), restart=True),
    ]
    status, events = supervise(tmp_path, specs, **FAST, stop_grace_s=1)  # the worker sleeps on

    assert status == 0
    assert starts_of(tmp_path) == 5
    assert events.of("failing") == []


def test_crash_loop_starts_0_never_gives_up(tmp_path: Path) -> None:
    status, events = supervise(
        tmp_path, planned(tmp_path, "fail a"), **FAST, crash_loop_starts=0, max_restarts=4
    )

    assert status == 1
    assert events.of("failing") == []
    assert [f["name"] for f in events.of("gave_up")] == ["generate-0"]


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    specs = [
        ChildSpec("scheduler", py(WAITER, 0, pid_file), restart=False),
        ChildSpec("generate-0", py(STUBBORN, pid_file), restart=True),
    ]
    started = time.monotonic()
    status, events = supervise(tmp_path, specs, stop_grace_s=0.5)

    assert status == 0
    assert time.monotonic() - started >= 0.5
    assert [f["name"] for f in events.of("killed")] == ["generate-0"]
    assert events.of("exited", "generate-0")[0]["signal"] == "SIGKILL"
    assert not alive(pid_of(pid_file))


def test_request_stop_drains_the_workers_before_the_primary(tmp_path: Path) -> None:
    # The scheduler notes, on its SIGTERM, whether the worker was still there, then exits 0.
    # (Its supervisor, the parent, has reaped the worker by then: no zombie to tell apart.)
    scheduler = """
import os, pathlib, signal, sys, time
def on_term(signum, frame):
    pid = int(pathlib.Path(sys.argv[1]).read_text().split()[0])
    pathlib.Path(sys.argv[2]).write_text(str(os.path.exists(f"/proc/{pid}")))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
time.sleep(60)
"""
    pid_file, verdict = tmp_path / "worker.pid", tmp_path / "worker-alive-at-term"
    specs = [
        ChildSpec("scheduler", py(scheduler, pid_file, verdict), restart=False),
        ChildSpec("generate-0", py(SLEEPER, pid_file), restart=True),
    ]
    recorder = Recorder()
    supervisor = Supervisor(specs, tmp_path / "logs", on_event=recorder)
    stopper = threading.Thread(target=lambda: (pid_of(pid_file), supervisor.request_stop()))
    stopper.start()
    status = supervisor.run()
    stopper.join()

    assert status == 0
    assert verdict.read_text() == "False"
    assert recorder.of("stopping") == [{"reason": "stop requested"}]


def test_env_is_added_to_the_childs_environment(tmp_path: Path) -> None:
    script = "import os; print(os.environ['ASYNCRL_TEST'], 'PATH' in os.environ)"
    specs = [ChildSpec("scheduler", py(script), restart=False, env={"ASYNCRL_TEST": "hello"})]
    status, _ = supervise(tmp_path, specs)

    assert status == 0
    assert (tmp_path / "logs" / "scheduler.log").read_text() == "hello True\n"


def start_driver(tmp_path: Path, specs: list[ChildSpec], grace_s: float) -> subprocess.Popen[bytes]:
    config = {
        "specs": [{"name": s.name, "argv": list(s.argv), "restart": s.restart} for s in specs],
        "log_dir": str(tmp_path / "logs"),
        "grace_s": grace_s,
    }
    with (tmp_path / "driver.err").open("w") as stderr:
        command = [sys.executable, "-c", DRIVER, json.dumps(config)]  # needs asyncrl: site on
        return subprocess.Popen(command, stderr=stderr)


def test_sigint_stops_every_child_and_exits_130(tmp_path: Path) -> None:
    pid_files = [tmp_path / "scheduler.pid", tmp_path / "w0.pid", tmp_path / "w1.pid"]
    specs = [
        ChildSpec("scheduler", py(SLEEPER, pid_files[0]), restart=False),
        ChildSpec("generate-0", py(SLEEPER, pid_files[1]), restart=True),
        ChildSpec("train-0", py(SLEEPER, pid_files[2]), restart=True),
    ]
    driver = start_driver(tmp_path, specs, grace_s=5)
    pids = [pid_of(path) for path in pid_files]

    driver.send_signal(signal.SIGINT)

    assert driver.wait(timeout=20) == 130
    assert not any(alive(pid) for pid in pids)
    err = (tmp_path / "driver.err").read_text()
    assert "asyncrl run: stopping: got SIGINT" in err
    assert "asyncrl run: done, exit code 130" in err


def test_a_second_sigint_kills_at_once(tmp_path: Path) -> None:
    pid_files = [tmp_path / "scheduler.pid", tmp_path / "worker.pid"]
    specs = [
        ChildSpec("scheduler", py(SLEEPER, pid_files[0]), restart=False),
        ChildSpec("generate-0", py(STUBBORN, pid_files[1]), restart=True),
    ]
    driver = start_driver(tmp_path, specs, grace_s=30)
    pids = [pid_of(path) for path in pid_files]

    driver.send_signal(signal.SIGINT)
    wait_until(lambda: "stopping" in (tmp_path / "driver.err").read_text())
    driver.send_signal(signal.SIGINT)

    assert driver.wait(timeout=10) == 130  # long before the 30 s grace period
    assert not any(alive(pid) for pid in pids)
    assert "killed generate-0" in (tmp_path / "driver.err").read_text()


def test_kill_9_of_the_supervisor_leaves_no_child(tmp_path: Path) -> None:
    pid_files = [tmp_path / "scheduler.pid", tmp_path / "worker.pid"]
    specs = [
        ChildSpec("scheduler", py(SLEEPER, pid_files[0]), restart=False),
        ChildSpec("generate-0", py(STUBBORN, pid_files[1]), restart=True),
    ]
    driver = start_driver(tmp_path, specs, grace_s=5)
    pids = [pid_of(path) for path in pid_files]

    driver.kill()
    driver.wait(timeout=10)

    wait_until(lambda: not any(alive(pid) for pid in pids), timeout_s=3)


def test_bad_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        Supervisor([ChildSpec("a", ["true"], False), ChildSpec("a", ["true"], True)], Path("."))
    with pytest.raises(ValueError, match="log file"):
        ChildSpec("../a", ["true"], restart=True)


# Records its command line; fails unless resumed (argv ends with --resume).
RESUMER = """
import sys
with open(sys.argv[1], "a") as f:
    f.write(" ".join(sys.argv[2:]) + "\\n")
sys.exit(0 if sys.argv[-1] == "--resume" else 7)
"""


def test_a_failed_primary_with_a_resume_command_is_started_again_with_it(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    specs = [
        ChildSpec(
            "scheduler",
            py(RESUMER, starts, "start"),
            restart=False,
            resume_argv=py(RESUMER, starts, "start", "--resume"),
        ),
        ChildSpec("generate-0", py("import time; time.sleep(60)"), restart=True),
    ]
    status, events = supervise(tmp_path, specs, backoff_initial_s=0.01)

    assert status == 0  # the resumed primary finished the run
    assert starts.read_text().splitlines() == ["start", "start --resume"]
    assert len(events.of("started", "generate-0")) == 1  # the workers were left running


def test_a_primary_failing_on_every_resume_ends_the_run_with_why(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    fails = py(RESUMER, starts, "start")
    specs = [
        ChildSpec("scheduler", fails, restart=False, resume_argv=[*fails, "again"]),
        ChildSpec("generate-0", py("import time; time.sleep(60)"), restart=True),
    ]
    status, events = supervise(tmp_path, specs, backoff_initial_s=0.01)

    assert status == 1  # gave up, as for a worker failing on every start
    assert len(starts.read_text().splitlines()) == 3
    assert [f["name"] for f in events.of("failing")] == ["scheduler"]


def test_a_primary_that_says_the_run_cannot_go_on_is_not_resumed(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    says = f"import sys; open({str(starts)!r}, 'a').write('start\\n'); sys.exit({STOPS_THE_RUN})"
    specs = [
        ChildSpec("scheduler", py(says), restart=False, resume_argv=py(says)),
        ChildSpec("generate-0", py("import time; time.sleep(60)"), restart=True),
    ]
    status, _ = supervise(tmp_path, specs, backoff_initial_s=0.01)

    assert status == STOPS_THE_RUN  # its exit status is the run's
    assert starts.read_text().splitlines() == ["start"]  # no resume could help


# A gang member: records its rank and leader address; rank 1 fails once, 0.3 s in.
GANG_MEMBER = """
import os, pathlib, sys, time
log = pathlib.Path(sys.argv[1])
rank = os.environ["RANK_FOR_TEST"]
with log.open("a") as f:
    f.write(f"{rank} {os.environ['ASYNCRL_GANG_ADDR']}\\n")
if rank == "1" and log.read_text().count("1 ") == 1:
    time.sleep(0.3)
    sys.exit(3)
time.sleep(60)
"""


def test_a_gang_member_failing_restarts_the_whole_gang_at_a_new_address(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    specs = [
        ChildSpec("scheduler", py(WAITER, 0, tmp_path / "enough"), restart=False),
        *(
            ChildSpec(
                f"train-{r}",
                py(GANG_MEMBER, starts),
                restart=True,
                env={"RANK_FOR_TEST": str(r)},
                gang="train",
            )
            for r in range(2)
        ),
        ChildSpec("generate-0", py("import time; time.sleep(60)"), restart=True),
    ]
    recorder = Recorder()

    def on_event(kind: str, fields: dict[str, object]) -> None:
        recorder(kind, fields)
        if kind == "started" and fields["name"] == "train-0" and fields.get("restart") == 1:
            (tmp_path / "enough").touch()

    status = Supervisor(
        specs, tmp_path / "logs", backoff_initial_s=0.05, stop_grace_s=1, on_event=on_event
    ).run()

    assert status == 0
    assert [f["name"] for f in recorder.of("killed")][:1] == ["train-0"]  # killed with rank 1
    lines = starts.read_text().splitlines()
    started = [line.split() for line in lines]
    first, again = dict(started[:2]), dict(started[2:4])
    assert len(set(first.values())) == 1 and len(set(again.values())) == 1  # one leader each
    assert first["0"] != again["0"]  # a fresh rendezvous address for the new start
    assert len(recorder.of("started", "generate-0")) == 1  # outside the gang: left running


def test_without_a_primary_the_run_is_over_once_every_worker_has_left(tmp_path: Path) -> None:
    # A machine whose scheduler runs elsewhere: its workers leave (exit 0) at the run's end.
    specs = [
        ChildSpec("generate-a-0", py("import sys; sys.exit(0)"), restart=True),
        ChildSpec("logp-0", py("import time; time.sleep(0.5)"), restart=True),
    ]
    status, events = supervise(tmp_path, specs, stop_grace_s=5)
    assert status == 0
    assert events.of("stopping") == [{"reason": "every worker has left"}]
    assert events.of("restarting") == [] and events.of("killed") == []


def test_finish_lets_workers_leave_by_themselves_then_stops_the_rest(tmp_path: Path) -> None:
    go, pid_file = tmp_path / "go", tmp_path / "b.pid"
    specs = [
        ChildSpec("generate-a-0", py(LEAVER, go), restart=True),
        ChildSpec("reward-a-0", py(SLEEPER, pid_file), restart=True),
    ]
    recorder = Recorder()
    supervisor = Supervisor(specs, tmp_path / "logs", on_event=recorder, stop_grace_s=2)

    def the_run_ends() -> None:
        pid_of(pid_file)
        go.touch()
        supervisor.finish("the run is finished (4 steps)")

    threading.Thread(target=the_run_ends).start()
    assert supervisor.run() == 0
    assert recorder.of("stopping") == [{"reason": "the run is finished (4 steps)"}]
    assert [f.get("code") for f in recorder.of("exited", "generate-a-0")] == [0]
    assert [f.get("signal") for f in recorder.of("exited", "reward-a-0")] == ["SIGTERM"]


# Warns while running, then exits saying no restart can help (child_status.STOPS_THE_RUN).
WARNS_THEN_STOPS = """
import os, sys, time
status = os.environ["ASYNCRL_STATUS_FILE"]
with open(status, "a") as f:
    f.write("starting\\nup\\nwarn no weights reach generate-0 from train-0: no header\\n")
time.sleep(1.5)
with open(status, "a") as f:
    f.write("failed weights stalled: generate-0 got no version from train-0\\n")
sys.exit(69)
"""


def test_a_workers_warning_is_shown_once_and_its_stop_ends_the_run_with_why(
    tmp_path: Path,
) -> None:
    specs = [
        ChildSpec("scheduler", py("import time; time.sleep(60)"), restart=False),
        ChildSpec("generate-0", py(WARNS_THEN_STOPS), restart=True),
    ]
    status, events = supervise(tmp_path, specs, backoff_initial_s=0.01)

    assert status == 1
    assert events.of("warning") == [
        {"name": "generate-0", "text": "no weights reach generate-0 from train-0: no header"}
    ]
    assert events.of("restarting") == []  # no restart can help: the run stops
    why = "weights stalled: generate-0 got no version from train-0"
    assert events.of("exited", "generate-0")[0]["why"] == why
    assert events.of("stopping") == [{"reason": f"generate-0 cannot go on: {why}"}]
    assert events.kinds().index("warning") < events.kinds().index("stopping")
