"""run_python against hostile programs and ordinary ones, on this machine's real kernel.

Every test checks, after its runs, that nothing of them is left: no launcher, no process
of a run's uid, no mount of a run's in the host's table. A test that the caller survives
a program is the test process itself surviving it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.actors.sandbox import (
    CodeLimits,
    CodeRun,
    SandboxUnavailable,
    run_python,
    sandbox_problem,
)
from asyncrl.actors.sandbox import python as sandbox_python

pytestmark = pytest.mark.skipif(sandbox_problem() is not None, reason=str(sandbox_problem()))

# A fork bomb that survives its failed forks: it runs to the time limit.
STUBBORN_BOMB = """
import os, time
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)
"""


@pytest.fixture(autouse=True)
def launchers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The process ids of the launchers of the test's runs; after the test, none of them,
    no process of the launcher's code but the fork server, no process of their runs' uids,
    and no mount of theirs is left."""
    started: list[int] = []
    end = sandbox_python._Watch.end

    def recorded(watch: sandbox_python._Watch) -> None:
        end(watch)
        if watch.launcher is not None:
            started.append(watch.launcher)

    mounts_before = _host_mounts()
    monkeypatch.setattr(sandbox_python._Watch, "end", recorded)
    yield started
    plan = sandbox_python._plan()
    server = sandbox_python._server().pid
    uids = {plan.uid + pid for pid in started} if plan.per_run else set()

    def left() -> list[tuple[int, int, str]]:
        return [
            (pid, uid, cmdline)
            for pid, uid, cmdline in _processes()
            if pid in started
            or uid in uids
            or (sandbox_python._LAUNCHER in cmdline and pid != server)
        ]

    # A fork server whose caller just exited (a forked caller's) goes by its parent-death
    # signal, which the kernel delivers a moment later: allow it that moment, no more.
    deadline = time.monotonic() + 5.0
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left(), f"left behind: {left()}"
    assert _host_mounts() - mounts_before == set()


def _processes() -> Iterator[tuple[int, int, str]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone while we looked
        if "\nState:\tZ" in status or "\nState:\tX" in status:
            continue  # exited: it holds nothing, and is some parent's to reap
        uid = int(status.split("\nUid:\t", 1)[1].split()[0])
        yield int(entry.name), uid, cmdline


def _host_mounts() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def _failed(run: CodeRun, *reason: str) -> None:
    assert not run.ok, run
    assert run.reason is not None and "\n" not in run.reason
    assert any(text in run.reason for text in reason), run.reason


# Ordinary programs.


def test_a_program_prints_and_ends_well() -> None:
    run = run_python("print('hello', 6 * 7)")
    assert run == CodeRun(True, 0, "hello 42\n", "", None, run.seconds)
    assert 0 < run.seconds < CodeLimits().timeout_s


def test_a_strict_umask_of_the_caller_changes_nothing() -> None:
    previous = os.umask(0o077)
    try:
        run = run_python("import os\nopen('/dev/null', 'w').write('x')\nprint(oct(os.umask(0)))")
    finally:
        os.umask(previous)
    assert run.ok and run.stdout == "0o22\n", run


def test_an_exception_gives_its_message_as_the_reason() -> None:
    run = run_python("def f(x):\n    return 1 / x\n\nf(0)")
    assert run.exit_code == 1
    assert run.reason == "exited with status 1: ZeroDivisionError: division by zero"
    assert 'File "/main.py", line 2, in f' in run.stderr


def test_the_reason_is_the_last_error_line_not_a_traceback_cut_short() -> None:
    """Forked processes share stderr: one killed mid-traceback as the run ends leaves a
    header and frames after the error line that ended the run (a fork bomb's, here as
    its processes interleave it)."""
    source = (
        "import sys\n"
        'sys.stderr.write(\'Traceback (most recent call last):\\n  File "/main.py", line 3\\n'
        "BlockingIOError: [Errno 11] Resource temporarily unavailable\\n"
        'Traceback (most recent call last):\\n  File "/main.py", line 3, in <module>\\n'
        "    os.fork()\\nTrace')\n"
        "sys.exit(1)\n"
    )
    run = run_python(source, limits=CodeLimits(processes=8))
    assert run.reason == "over the process limit (8)", run.stderr


def test_a_test_harness_passes_and_fails_by_its_asserts() -> None:
    solution = "def add(a, b):\n    return a + b\n"
    passing = run_python(solution + "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n")
    assert passing.ok and passing.reason is None
    failing = run_python(solution + "assert add(2, 2) == 5, 'add(2, 2) is not 5'\n")
    assert failing.reason == "exited with status 1: AssertionError: add(2, 2) is not 5"
    exiting = run_python("import sys\nsys.exit(3)")
    assert (exiting.ok, exiting.exit_code, exiting.reason) == (False, 3, "exited with status 3")


def test_threads_subprocesses_and_multiprocessing_work_within_the_limits() -> None:
    source = """
import multiprocessing, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

def square(x):
    return x * x

if __name__ == "__main__":
    with ThreadPoolExecutor(8) as pool:
        print(sum(pool.map(square, range(10))))
    with multiprocessing.Pool(2) as pool:
        print(pool.map(square, range(4)))
    print(subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True).stdout)
"""
    run = run_python(source)
    assert run.ok, run
    assert run.stdout == "285\n[0, 1, 4, 9]\nb'child\\n'\n"


def test_stdin_is_the_program_input() -> None:
    run = run_python("import sys\nprint(sys.stdin.read().upper(), end='')", stdin="abc\ndé\n")
    assert run.stdout == "ABC\nDÉ\n"
    large = "x" * 300_000  # past a pipe's buffer, while the program is still starting
    run = run_python("import sys\nprint(len(sys.stdin.read()))", stdin=large)
    assert run.stdout == "300000\n"
    ignored = run_python("print('done')", stdin=large)  # never read: no one blocks on it
    assert ignored.ok and ignored.stdout == "done\n"


def test_it_writes_in_its_own_directory_and_the_host_sees_none_of_it() -> None:
    name = f"sandbox-{uuid.uuid4().hex}"
    run = run_python(
        "import os, tempfile\n"
        f"open('/tmp/{name}', 'w').write('x' * 1000)\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        "    open(os.path.join(d, 'f'), 'w').write('y')\n"
        f"print(os.getcwd(), os.path.getsize('/tmp/{name}'))\n"
    )
    assert run.ok and run.stdout == "/tmp 1000\n", run
    assert not Path("/tmp", name).exists()


# Hostile programs.


def test_an_infinite_loop_is_killed_at_the_time_limit() -> None:
    run = run_python("while True:\n    pass", limits=CodeLimits(timeout_s=0.5))
    _failed(run, "ran past 0.5 s")
    assert run.exit_code is None
    assert 0.5 <= run.seconds < 0.5 + sandbox_python._GRACE_S + 1  # the margin it keeps


def test_a_program_that_ignores_sigterm_is_killed_all_the_same() -> None:
    source = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    run = run_python(source, limits=CodeLimits(timeout_s=2.0))
    _failed(run, "ran past 2 s")
    assert run.stdout == "ready\n"  # what it printed before the kill is kept


def test_a_fork_bomb_meets_the_process_limit() -> None:
    source = "import os\nwhile True:\n    os.fork()\n"
    run = run_python(source, limits=CodeLimits(timeout_s=2.0, processes=8))
    _failed(run, "over the process limit (8)", "ran past 2 s")
    # One that survives its failed forks runs to the time limit, and goes as a whole.
    run = run_python(STUBBORN_BOMB, limits=CodeLimits(timeout_s=0.5, processes=8))
    _failed(run, "ran past 0.5 s")


def test_the_process_limit_is_the_run_s_own() -> None:
    """A fork bomb next to an ordinary run takes nothing from it: each run's processes
    are counted apart."""
    bomb = threading.Thread(
        target=run_python, args=(STUBBORN_BOMB,), kwargs={"limits": CodeLimits(timeout_s=1.5)}
    )
    bomb.start()
    try:
        time.sleep(0.3)  # by now it forks as fast as its limit lets it
        runs = [
            run_python(
                "import subprocess, sys\n"
                "subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
            )
            for _ in range(3)
        ]
    finally:
        bomb.join()
    assert all(run.ok for run in runs), runs


def test_a_memory_hog_meets_the_memory_limit() -> None:
    run = run_python("x = bytearray(1 << 30)", limits=CodeLimits(memory_mb=128))
    _failed(run, "over the memory limit (128 MiB)")
    growing = run_python("x = []\nwhile True:\n    x.append(' ' * 10**6)\n")
    _failed(growing, "over the memory limit (256 MiB)")


def test_it_has_no_network() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        source = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        run = run_python(source)
        _failed(run, "Network is unreachable")
        server.settimeout(0.1)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing came
    outside = run_python("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)")
    _failed(outside, "Network is unreachable")
    names = run_python("import socket\nprint(socket.if_nameindex())")
    assert names.stdout == "[(1, 'lo')]\n"


def test_a_write_outside_its_directory_fails() -> None:
    for path in (Path.cwd() / "written-by-the-sandbox", Path("/etc/x"), Path("/x"), Path("/usr/x")):
        run = run_python(f"open({str(path)!r}, 'w').write('x')")
        _failed(run, "Read-only file system", "No such file or directory")
        assert not path.exists()


def test_it_sees_nothing_of_the_host_s_files() -> None:
    source = (
        "import os\n"
        "print(sorted(os.listdir('/')))\n"
        f"print(os.path.exists({str(Path(__file__))!r}), os.path.exists('/work'))\n"
    )
    run = run_python(source)
    assert run.ok, run
    listing, seen = run.stdout.splitlines()
    assert "'tmp'" in listing and "'main.py'" in listing and "'home'" not in listing
    assert seen == "False False"


def test_a_file_over_the_limit_fails() -> None:
    run = run_python(
        "open('/tmp/big', 'wb').write(b'x' * (2 << 20))", limits=CodeLimits(file_bytes=1 << 20)
    )
    _failed(run, "wrote over the file limit (1048576 bytes)")


def test_huge_output_is_cut_and_killed() -> None:
    run = run_python("while True:\n    print('x' * 1000)", limits=CodeLimits(output_bytes=10_000))
    _failed(run, "printed over 10000 bytes")
    assert len(run.stdout) == 10_000 and run.exit_code is None
    errors = run_python(
        "import sys\nsys.stderr.write('e' * 100_000)", limits=CodeLimits(output_bytes=10_000)
    )
    _failed(errors, "printed over 10000 bytes")


@pytest.mark.parametrize(
    "kill",
    ["os.kill(os.getppid(), 9)", "os.kill(1, 9)", "os.kill(-1, 9)", "os.killpg(0, 9)"],
)
def test_killing_its_parent_or_everything_reaches_nothing_outside(kill: str) -> None:
    run = run_python(f"import os, time\n{kill}\ntime.sleep(0.2)\nprint('after')")
    # The kill is refused, finds no one, or kills the program itself; the caller, this
    # test, is still here to say so.
    _failed(run, "PermissionError", "ProcessLookupError", "killed by SIGKILL")


def test_a_segfault_and_a_stack_overflow_are_crashes() -> None:
    segfault = run_python("import ctypes\nctypes.string_at(0)")
    _failed(segfault, "killed by SIGSEGV")
    # Each call through __call__ takes C stack, past the 8 MiB there is.
    deep = (
        "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f.__call__(n + 1)\nf(0)\n"
    )
    _failed(run_python(deep), "killed by SIGSEGV")


def test_it_gets_a_minimal_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCRL_TEST_SECRET", "hunter2")
    source = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n"
        "            print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "        except OSError as error:\n"
        "            print(pid, type(error).__name__)\n"
    )
    run = run_python(source)
    assert run.ok, run
    assert "hunter2" not in run.stdout
    assert run.stdout.splitlines()[0] == "['HOME', 'LANG', 'MALLOC_ARENA_MAX', 'PATH', 'TMPDIR']"


def test_a_detached_child_goes_with_its_run() -> None:
    source = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(0.1)\n"
        "print(os.getuid())\n"
    )
    run = run_python(source)
    assert run.ok, run  # the fixture checks that nothing of its uid is left


def test_a_caller_interrupted_mid_run_leaves_nothing() -> None:
    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Interrupted):
            run_python("while True:\n    pass", limits=CodeLimits(timeout_s=30.0))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_dead_caller_takes_its_runs_with_it(tmp_path: Path) -> None:
    """A caller killed outright, mid-run: its end of the control socket closes, and the
    launcher kills the run and leaves."""
    caller = subprocess.Popen(
        [
            sys.executable, "-c",
            "from asyncrl.actors.sandbox import CodeLimits, run_python\n"
            "print('go', flush=True)\n"
            "run_python('while True:\\n    pass', limits=CodeLimits(timeout_s=60.0))\n",
        ],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert caller.stdout is not None
    assert caller.stdout.readline() == b"go\n"
    time.sleep(0.5)
    # Its fork server, and the launcher that server forked for the run.
    servers = [pid for pid, _, cmdline in _processes() if _parent(pid) == caller.pid]
    ours = [
        pid for pid, _, cmdline in _processes()
        if sandbox_python._LAUNCHER in cmdline and _parent(pid) in servers
    ]  # fmt: skip
    assert len(servers) == 1 and ours
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in ours):
        time.sleep(0.05)
    assert not any(Path(f"/proc/{pid}").exists() for pid in [*servers, *ours])


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_runs_in_threads_at_once() -> None:
    results: list[CodeRun] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(run_python(f"print({i})")))
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(run.stdout for run in results) == ["0\n", "1\n", "2\n", "3\n"]


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        CodeLimits(timeout_s=0)
    with pytest.raises(ValueError, match="processes"):
        CodeLimits(processes=0)


def test_a_sandbox_that_cannot_be_made_says_why() -> None:
    plan = sandbox_python._plan()
    # Nothing of the host bound: the interpreter is not there to start.
    broken = sandbox_python._Plan(plan.python, (), plan.uid, plan.per_run)
    with pytest.raises(SandboxUnavailable) as raised:
        sandbox_python._run(broken, "print(1)", "", CodeLimits())
    assert "\n" not in str(raised.value)


_AS_NOBODY = """
import json, os
from asyncrl.actors.sandbox import CodeLimits, run_python, sandbox_problem
from asyncrl.actors.sandbox import python as sandbox_python

runs = {
    "whoami": "import os\\nprint(os.getuid(), os.getcwd())",
    "fork bomb": "import os\\nwhile True:\\n    os.fork()",
    "network": "import socket\\nsocket.create_connection(('1.1.1.1', 53), timeout=1)",
    "write": "open('/etc/x', 'w')",
    "init": "import os, time\\nos.kill(1, 2)\\ntime.sleep(0.2)\\nprint('after')",
    "group": "import os\\nos.killpg(0, 9)",
}
print(json.dumps({
    "euid": os.geteuid(),
    "problem": sandbox_problem(),
    "uid": sandbox_python._plan().uid,
    **{name: [run.reason, run.stdout] for name, run in (
        (name, run_python(source)) for name, source in runs.items()
    )},
}))
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")),
    reason="becomes another user: needs root, and util-linux's unshare and setpriv",
)
def test_without_root_each_run_gets_a_user_namespace(tmp_path: Path) -> None:
    """An unprivileged caller: the same isolation from a user namespace per run. Run as
    nobody, in a mount namespace where the directories on the way to this interpreter and
    this tree that nobody may not enter (/root, here) are made passable."""
    script = ["set -e"]
    for number, (blocked, names) in enumerate(_blocked_ancestors().items()):
        stage = tmp_path / f"stage{number}"
        stage.mkdir()
        script.append(f"mount -t tmpfs -o mode=755 tmpfs {stage}")
        for name in names:
            script.append(f"mkdir {stage / name} && mount --bind {blocked / name} {stage / name}")
        script.append(f"mount --move {stage} {blocked}")
    nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups --"
    script.append(f'exec {nobody} {sys.executable} -c "$1"')
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script),
         "sh", _AS_NOBODY],
        capture_output=True, text=True, timeout=120,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert (seen["euid"], seen["problem"], seen["uid"]) == (65534, None, -1)
    assert seen["whoami"] == [None, "1000 /tmp\n"]
    assert seen["fork bomb"][0] in ("over the process limit (16)", "ran past 5 s")
    assert "Network is unreachable" in seen["network"][0]
    assert "Read-only file system" in seen["write"][0]
    assert seen["init"] == [None, "after\n"]  # init ignores it; the run goes on
    assert seen["group"][0] == "killed by SIGKILL"


def _blocked_ancestors() -> dict[Path, list[str]]:
    """The directories that others may not enter on the way to what the test needs, each
    with the names under it on those ways; the shallowest first."""
    needed = {
        Path(os.path.realpath(sys._base_executable)),
        Path(sys.prefix),
        Path(os.path.realpath(sys.base_prefix)),
        Path(__file__).resolve().parents[4],
    }
    blocked: dict[Path, list[str]] = {}
    for path in needed:
        for parent, child in zip(path.parents, [path, *path.parents], strict=False):
            if not parent.stat().st_mode & stat.S_IXOTH:
                names = blocked.setdefault(parent, [])
                if child.name not in names:
                    names.append(child.name)
    return dict(sorted(blocked.items(), key=lambda item: len(item[0].parts)))


def test_a_fork_server_killed_between_runs_is_started_again() -> None:
    assert run_python("print(1)").ok
    server = sandbox_python._server().pid
    assert server is not None
    os.kill(server, signal.SIGKILL)
    run = run_python("print(2)")
    assert run.ok and run.stdout == "2\n"
    assert sandbox_python._server().pid not in (None, server)


def test_a_forked_caller_gets_a_fork_server_of_its_own() -> None:
    assert run_python("print(1)").ok
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (its result comes back through the pipe)
        try:
            run = run_python("print(3)")
            served = sandbox_python._server().pid
            os.write(writer, f"{run.stdout.strip()} {served != os.getpid()}".encode())
        finally:
            os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    with os.fdopen(reader) as answer:
        assert answer.read() == "3 True"
