"""What payload size costs the real pipeline, before and after a change, side by side.

    python -m tests.bench.payload_plane [--sizes 64KiB,1MiB,8MiB] [--steps 30]
        [--batch-groups 8] [--repeats 3] [--baseline-commit 4b420b3] [--after-only]

"After" is this working tree (the asyncrl the running Python imports, which must be this
checkout); "before" is the code of ``--baseline-commit``, unmodified. For every payload
size each side runs the real pipeline: ``asyncrl-scheduler start`` and one
``asyncrl-worker`` per role, as separate processes over ZeroMQ, with the synthetic roles
of :mod:`tests.bench.payload_actors` (no model: a group's cost is what the runtime spends
on its payloads; generate makes ``size`` bytes per group, logp and ref_logp a quarter
each). The first ``--warmup`` steps are left out; over the next ``--steps`` steps of
``--batch-groups`` groups it measures

- groups per second, from the step times in ``metrics.jsonl`` (the scheduler's clock);
- the scheduler process's CPU seconds (``/proc/<pid>/stat`` utime + stime, all its
  threads) per group trained;
- the scheduler's peak resident memory (``VmHWM``) at the end of the window.

Before and after take turns for each size, the order swapped on every repeat (AB BA AB),
and the median of the repeats is printed, so drift on a shared machine falls on both.
Groups per second is the noisy figure on a busy machine (the same code ran at 105 and
176 groups/s in two runs of one session); the scheduler's CPU per group stays within a
few percent. Progress goes to stderr, the table to stdout. Every step's ``payload_bytes``
is checked against the size, so a run that lost payloads fails rather than looks fast.
A run with the defaults took 2 min 20 s on the 2-core development VM (baseline built;
both sides the same code, about 17 groups/s at 8 MiB); a faster "after" takes less.

The baseline is built once into ``.bench-cache/baseline-<sha>/`` (git-ignored): the
commit's files from ``git archive`` and a virtual environment of their own with
torch==2.13.0 and ``pip install -e`` of those files, so nothing of the working tree can be
imported by mistake. Both sides print where ``asyncrl.runtime`` came from, and the bench
refuses to run if it is the same place. The first run spends about 70 s on this (mostly
installing torch from pip's cache) and 1.3 GB of disk; later runs reuse it. Delete the
folder to rebuild it. The synthetic roles come from this checkout on both sides (they use
only the actor contract), and each run's journal lives in a temporary directory: the
baseline journals every payload (12 MiB a group at 8 MiB, some 3 GB in a default run), and
that is part of what it costs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from asyncrl.transport import protocol as p
from tests.bench.payload_actors import PAYLOAD_ENV, ROLES, group_bytes
from tests.support.runlink import run_link

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".bench-cache"
BASELINE_TORCH = "torch==2.13.0"  # the CPU build; left to itself pip picks a CUDA one
ACTORS = "tests.bench.payload_actors"
_STALL_S = 90.0  # no new step for this long: the run is stuck, stop it
_POLL_S = 0.01

# --- the two sides ---------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """A version of the runtime: the Python that runs it and where its asyncrl lives."""

    name: str
    python: Path
    code: Path  # the folder asyncrl.runtime was imported from

    @property
    def worker_module(self) -> str:
        """The worker command's module: it moved from runtime to actors with the stack."""
        moved = (self.code.parent / "actors" / "cli.py").exists()
        return "asyncrl.actors.cli" if moved else "asyncrl.runtime.launch.cli.worker"


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for every process of a run: this checkout's ``tests`` and nothing else.

    PYTHONPATH names only the repository root, for ``tests.bench.payload_actors``; the
    root holds no ``asyncrl`` folder, so asyncrl itself comes from each side's install.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(REPO)
    return {**env, **(extra or {})}


_PROBE = """
import os, asyncrl.actors, asyncrl.runtime, asyncrl.transport
for package in (asyncrl.runtime, asyncrl.actors, asyncrl.transport):
    print(os.path.dirname(os.path.realpath(package.__file__)))
"""


def imported_runtime(python: Path, cwd: Path) -> Path:
    """The folder ``asyncrl.runtime`` comes from under ``python``, as a run's processes see it.

    Its sibling packages must come from the same checkout, or the side is refused.
    """
    out = subprocess.run(
        [str(python), "-c", _PROBE], cwd=cwd, env=child_env(), capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"{python} cannot import asyncrl:\n{out.stderr[-2000:]}")
    runtime, *others = (Path(line) for line in out.stdout.split())
    if any(other.parent != runtime.parent for other in others):
        raise SystemExit(f"{python} imports asyncrl from several places: {out.stdout}")
    return runtime


def working_side(cwd: Path) -> Side:
    code = imported_runtime(Path(sys.executable), cwd)
    if code != REPO / "runtime":
        raise SystemExit(
            f"this Python imports asyncrl.runtime from {code}, not from this checkout "
            f"({REPO / 'runtime'}): run the bench with the venv that has it installed (-e)"
        )
    return Side("after", Path(sys.executable), code)


def baseline_side(commit: str, cwd: Path) -> Side:
    sha = _git("rev-parse", "--verify", f"{commit}^{{commit}}").strip()
    home = CACHE / f"baseline-{sha[:12]}"
    python = home / "venv" / "bin" / "python"
    if not (home / "ready").exists():
        _build_baseline(sha, home)
    code = imported_runtime(python, cwd)
    if not code.is_relative_to(home / "src"):
        raise SystemExit(f"the baseline imports asyncrl.runtime from {code}, not from {home}")
    return Side("before", python, code)


def _build_baseline(sha: str, home: Path) -> None:
    started = time.monotonic()
    progress(f"building the baseline {sha[:12]} in {home} (once; a few minutes)")
    if home.exists():
        subprocess.run(["rm", "-rf", str(home)], check=True)
    src = home / "src"
    src.mkdir(parents=True)
    git_archive = ["git", "archive", "--format=tar", sha]
    archive = subprocess.Popen(git_archive, cwd=REPO, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {sha} failed")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, BASELINE_TORCH], check=True)
    subprocess.run([*pip, "-e", str(src)], check=True)
    (home / "ready").write_text(sha + "\n")
    progress(f"baseline ready in {time.monotonic() - started:.0f} s")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True)
    return done.stdout


# --- one run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    groups_per_s: float
    cpu_ms_per_group: float
    peak_rss_mib: float
    requests_per_group: float | None = None  # the scheduler's own count, where it keeps one


class ProcessProbe:
    """CPU time and peak memory of a live process, from /proc."""

    _TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

    def __init__(self, pid: int) -> None:
        self.proc = Path("/proc") / str(pid)

    def cpu_s(self) -> float:
        # Fields after the command's closing parenthesis start at field 3 (state);
        # utime and stime are fields 14 and 15.
        fields = (self.proc / "stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) * self._TICK_S

    def peak_rss_mib(self) -> float:
        for line in (self.proc / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")


class Run:
    """One pipeline: a scheduler and a worker per role, in their own run directory."""

    def __init__(
        self,
        side: Side,
        root: Path,
        size: int,
        batch: int,
        total_steps: int,
        busy_poll_us: int | None = None,
        scheduler_core: bool = False,
    ) -> None:
        self.scheduler_core = scheduler_core
        self.side = side
        self.root = root
        self.run_dir = root / "run"
        self.logs = root / "logs"
        self.logs.mkdir(parents=True)
        self.env = child_env({PAYLOAD_ENV: str(size)})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.config = root / "run.yaml"
        config = run_config(self.run_dir, size, batch, total_steps, busy_poll_us)
        self.config.write_text(yaml.safe_dump(config))

    def start(self) -> ProcessProbe:
        scheduler = self._spawn("scheduler", "asyncrl.runtime.scheduler.cli", "start")
        self._pin(scheduler, scheduler=True)
        deadline = time.monotonic() + 60
        while not (self.run_dir / "endpoints.json").exists():
            if scheduler.poll() is not None or time.monotonic() > deadline:
                raise RunFailed("the scheduler did not come up", self.log_tail("scheduler"))
            time.sleep(0.05)
        for role in ROLES:
            module = self.side.worker_module
            self._pin(self._spawn(f"{role}-0", module, "--role", role, "--index", "0"))
        return ProcessProbe(scheduler.pid)

    def _pin(self, proc: subprocess.Popen[bytes], scheduler: bool = False) -> None:
        """With --scheduler-core: the scheduler alone on core 0, the workers on the rest.
        Set at once after the start, before the process makes its threads, which inherit it."""
        if not self.scheduler_core:
            return
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(proc.pid, cores[:1] if scheduler else cores[1:])

    def _spawn(self, name: str, module: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [str(self.side.python), "-m", module, *args, "-c", str(self.config)],
                cwd=self.root,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        return proc

    def steps(self) -> Iterator[dict[str, Any]]:
        """Each step's metrics line as it is written; raises if the run stops making steps."""
        path = self.run_dir / "metrics.jsonl"
        buffered = ""
        offset = 0
        last_step_at = time.monotonic()
        while True:
            if path.exists():
                with open(path, encoding="utf-8") as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                buffered += chunk
                *lines, buffered = buffered.split("\n")
                for line in lines:
                    if line.strip():
                        last_step_at = time.monotonic()
                        yield json.loads(line)
            self._check_alive(last_step_at)
            time.sleep(_POLL_S)

    def _check_alive(self, last_step_at: float) -> None:
        dead = [n for n, p in self.procs.items() if p.poll() is not None]
        if dead:
            raise RunFailed(f"{', '.join(dead)} exited mid-run", self.log_tail(dead[0]))
        if time.monotonic() - last_step_at > _STALL_S:
            raise RunFailed(f"no train step for {_STALL_S:.0f} s", self.log_tail("train-0"))

    def stop(self) -> None:
        """Stop the run (it has more steps than are measured): a stop signal to every
        process, then the kill for whatever is still there after a while."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def log_tail(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


class RunFailed(Exception):
    def __init__(self, what: str, log: str) -> None:
        super().__init__(f"{what}\n--- log tail ---\n{log}")


def run_config(
    run_dir: Path, size: int, batch: int, total_steps: int, busy_poll_us: int | None = None
) -> dict[str, Any]:
    # Before the data plane a train lease carried every payload of its batch in one message.
    largest = batch * group_bytes(size)
    scheduler: dict[str, Any] = {
        "control_port": 0,
        "events_port": 0,
        "max_message_mb": max(64, 2 * largest // 2**20 + 16),
    }
    if busy_poll_us is not None:  # a key both sides know
        scheduler["busy_poll_us"] = busy_poll_us
    return {
        "run": {"dir": str(run_dir), "name": "payload-bench", "total_steps": total_steps},
        "pipeline": {"actors": ACTORS, "train_batch_groups": batch},
        # Every stage runs on both sides, as before the ref_logp stage became conditional.
        "algorithm": {"kl_coef": 0.01},
        "scheduler": scheduler,
    }


def measure(
    side: Side,
    size: int,
    steps: int,
    batch: int,
    warmup: int,
    busy_poll_us: int | None = None,
    scheduler_core: bool = False,
) -> Measurement:
    """Run the pipeline for ``warmup + steps`` steps and measure the last ``steps``."""
    with tempfile.TemporaryDirectory(prefix="asyncrl-payload-bench-") as tmp:
        # More steps than measured (the run is stopped after the window): once a run's last
        # step is done its scheduler drains and leaves, and the window's end still asks it
        # how many requests it answered. A step takes milliseconds at small sizes.
        total = warmup + steps + 1000
        run = Run(side, Path(tmp), size, batch, total, busy_poll_us, scheduler_core)
        try:
            probe = run.start()
            return _window(run, probe, size, batch, warmup, steps)
        finally:
            run.stop()


def _window(
    run: Run, probe: ProcessProbe, size: int, batch: int, warmup: int, steps: int
) -> Measurement:
    start_s = start_cpu = 0.0
    start_requests = None
    if warmup == 0:
        start_cpu = probe.cpu_s()  # from the scheduler's start: its set-up counts
        start_requests = requests_answered(run)
    for line in run.steps():
        step = line["step"]
        if step > warmup and line.get("payload_bytes") != batch * group_bytes(size):
            raise RunFailed(f"step {step} trained {line.get('payload_bytes')} payload bytes", "")
        if step == warmup:
            start_s, start_cpu = line["elapsed_s"], probe.cpu_s()
            start_requests = requests_answered(run)
        if step == warmup + steps:
            cpu = probe.cpu_s() - start_cpu
            groups = steps * batch
            end_requests = requests_answered(run)
            per_group = None
            if start_requests is not None and end_requests is not None:
                per_group = (end_requests - start_requests - 1) / groups  # less our own ask
            return Measurement(
                groups_per_s=groups / max(line["elapsed_s"] - start_s, 1e-9),
                cpu_ms_per_group=1000 * cpu / groups,
                peak_rss_mib=probe.peak_rss_mib(),
                requests_per_group=per_group,
            )
    raise AssertionError("unreachable: steps() ends only by raising")


def requests_answered(run: Run) -> int | None:
    """How many requests the scheduler has answered, if it counts them (and speaks this
    checkout's protocol): the work its CPU goes to, whatever the payloads weigh."""
    if run.side.name != "after":
        return None
    with run_link(run.run_dir, "bench-observer") as link:
        reply = link.request(p.Status(), 10)
    if not isinstance(reply, p.StatusReply) or "requests" not in reply.summary:
        return None
    return sum(reply.summary["requests"].values())


# --- the report -------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20}


def parse_size(text: str) -> int:
    """Bytes from ``64KiB``, ``1MiB``, ``4096`` or ``4096B`` (case ignored)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match and _UNITS.get(match.group(2).lower())
    if not match or unit is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size like 64KiB, 1MiB or 4096")
    size = int(match.group(1)) * unit
    if size < 16 or size % 16:
        raise argparse.ArgumentTypeError(f"{text!r}: a payload is a positive multiple of 16 bytes")
    return size


def size_name(size: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def _ratio(after: float | None, before: float | None) -> str:
    return "-" if after is None or not before else f"{after / before:.2f}x"


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


Results = dict[tuple[str, int], Measurement]


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def report(results: Results, sizes: list[int], steps: int, batch: int) -> None:
    def get(side: str, size: int, field: str) -> float | None:
        m = results.get((side, size))
        return None if m is None else getattr(m, field)

    print(f"\n{steps} measured steps x {batch} groups per run; ratio = after / before")
    head = (
        f"{'size':>7} | {'groups/s before':>15} {'after':>8} {'ratio':>7} | "
        f"{'sched CPU ms/group before':>25} {'after':>8} {'ratio':>7} | "
        f"{'sched peak RSS MiB before':>25} {'after':>7}"
    )
    print(head)
    print("-" * len(head))
    for size in sizes:
        rate = [get(s, size, "groups_per_s") for s in ("before", "after")]
        cpu = [get(s, size, "cpu_ms_per_group") for s in ("before", "after")]
        rss = [get(s, size, "peak_rss_mib") for s in ("before", "after")]
        print(
            f"{size_name(size):>7} | {_cell(rate[0], '.1f'):>15} {_cell(rate[1], '.1f'):>8} "
            f"{_ratio(rate[1], rate[0]):>7} | {_cell(cpu[0], '.2f'):>25} "
            f"{_cell(cpu[1], '.2f'):>8} {_ratio(cpu[1], cpu[0]):>7} | "
            f"{_cell(rss[0], '.0f'):>25} {_cell(rss[1], '.0f'):>7}"
        )
    small, large = min(sizes), max(sizes)
    if small == large:
        return
    print()
    sizes_ratio = f"{size_name(large)} / {size_name(small)}"
    for side in ("before", "after"):
        if (side, small) in results:
            cpu = [get(side, size, "cpu_ms_per_group") for size in (large, small)]
            print(f"{side}: scheduler CPU per group, {sizes_ratio}: {_ratio(*cpu)}")
    if ("before", large) in results:
        speedup = _ratio(get("after", large, "groups_per_s"), get("before", large, "groups_per_s"))
        print(f"groups/s at {size_name(large)}, after / before: {speedup}")
    print("(the data plane's targets: after's 8MiB / 64KiB CPU ratio within 1.2x;")
    print(" groups/s at 8MiB at least 3x before's)")
    counted = [(size, results[("after", size)]) for size in sizes if ("after", size) in results]
    if any(m.requests_per_group for _, m in counted):
        # The scheduler's work per group is its requests per group: what its CPU per group
        # adds beyond them is each request costing more (caches and cores shared with
        # workers moving the payloads), not work that grows with the payload.
        print("\nafter: requests the scheduler answered per group, and its CPU per request")
        for size, m in counted:
            per_request = _cell(
                m.requests_per_group and 1000 * m.cpu_ms_per_group / m.requests_per_group, ".0f"
            )
            print(
                f"{size_name(size):>7}: {_cell(m.requests_per_group, '.2f')} requests/group, "
                f"{per_request} µs CPU/request"
            )


# --- the command ------------------------------------------------------------------------


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=lambda text: [parse_size(s) for s in text.split(",") if s.strip()],
        default=[64 * 2**10, 2**20, 8 * 2**20],
        help="generate's payload per group, comma-separated (default 64KiB,1MiB,8MiB)",
    )
    parser.add_argument("--steps", type=int, default=30, help="measured train steps per run")
    parser.add_argument("--batch-groups", type=int, default=8, help="groups per train step")
    parser.add_argument("--warmup", type=int, default=1, help="steps left out before the window")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size and side (median)")
    parser.add_argument("--baseline-commit", default="4b420b3")
    parser.add_argument("--after-only", action="store_true", help="skip the baseline")
    parser.add_argument(
        "--scheduler-core",
        action="store_true",
        help="the scheduler alone on the first core, the workers on the others: its CPU "
        "per group without the workers' memory traffic in its core's caches",
    )
    parser.add_argument(
        "--busy-poll-us",
        type=int,
        default=None,
        help="the scheduler's scheduler.busy_poll_us on both sides (default: the config's). "
        "After a request it spins this long for the next one: CPU spent waiting, which "
        "grows with the time between requests, not with the work per group",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_groups < 1 or args.warmup < 0 or args.repeats < 1:
        parser.error("--steps, --batch-groups and --repeats must be at least 1, --warmup 0")

    with tempfile.TemporaryDirectory(prefix="asyncrl-payload-bench-") as tmp:
        sides = [working_side(Path(tmp))]
        if not args.after_only:
            sides.insert(0, baseline_side(args.baseline_commit, Path(tmp)))
            if sides[0].code == sides[1].code:
                raise SystemExit(f"before and after both import {sides[0].code}: refusing")
    for side in sides:
        print(f"{side.name}: asyncrl.runtime from {side.code} ({side.python})")

    results: Results = {}
    for size in args.sizes:
        samples: dict[str, list[Measurement]] = {side.name: [] for side in sides}
        for repeat in range(args.repeats):
            for side in sides if repeat % 2 == 0 else sides[::-1]:
                progress(f"{side.name} {size_name(size)} (run {repeat + 1}/{args.repeats}) ...")
                m = measure(
                    side,
                    size,
                    args.steps,
                    args.batch_groups,
                    args.warmup,
                    args.busy_poll_us,
                    args.scheduler_core,
                )
                progress(
                    f"  {m.groups_per_s:.1f} groups/s, scheduler {m.cpu_ms_per_group:.2f} ms "
                    f"CPU/group, peak RSS {m.peak_rss_mib:.0f} MiB"
                )
                samples[side.name].append(m)
        for name, ms in samples.items():
            results[name, size] = Measurement(
                statistics.median(m.groups_per_s for m in ms),
                statistics.median(m.cpu_ms_per_group for m in ms),
                statistics.median(m.peak_rss_mib for m in ms),
                _median_or_none([m.requests_per_group for m in ms]),
            )
    report(results, args.sizes, args.steps, args.batch_groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
