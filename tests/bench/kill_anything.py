"""Kill anything, lose nothing: the default run with ``kill -9`` of a random process every
few seconds, beside the same run undisturbed.

    python -m tests.bench.kill_anything [-c CONFIG] [--steps 200] [--every 2 6] [--seed 0]
        [--max-gap 30] [--no-baseline | --baseline-val V] [--work DIR] [section.key=value ...]

Both are real ``asyncrl run`` invocations of ``CONFIG`` (by default
``deploy/configs/default.yaml``, the embedded model learning long addition; with
``deploy/configs/dapo.yaml`` the groups dynamic sampling filters are counted too), one
after the other so neither slows the other. While the
disturbed one runs, a killer picks one of the supervisor's children at random (the
scheduler and every worker, each role alike; never the supervisor itself) every
``--every`` seconds (uniform between the two bounds) and sends it SIGKILL, until the run
ends. Nobody types ``--resume``: the supervisor restarts whatever died.

Printed, and checked (exit status 1 if any fails):

- the run finished on its own (exit 0);
- every step 1..N appears once in ``metrics.jsonl`` and every group was trained exactly
  once (the steps' ``keys``), none retrained by a rollback;
- every trainer restart resumed at the scheduler's step count: a restart that found only
  an older state would roll training back, and no log says "training rolled back";
- no group died: groups created, trained, filtered (dynamic sampling, with
  ``algorithm.filter_groups.enabled=true``) and dead are counted from the journal, and a
  dead one means a kill that had nothing to do with it was blamed on it; every group made
  is in exactly one state (trained, filtered, dead, superseded or still in flight), and
  the groups the journal counts trained are the keys the steps' lines name;
- no stretch without a step is longer than ``--max-gap`` seconds (30), counted from the
  first step, by the wall clock of this bench (it watches metrics.jsonl);
- the final validation reward is at most 0.05 below the undisturbed run's;
- no process of the run is left, and nothing of it in shared memory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.scheduler.replay import replay_journal

CONFIG = Path("deploy/configs/default.yaml")
VAL_TOLERANCE = 0.05


@dataclass
class Kill:
    at_s: float
    name: str
    pid: int
    steps_done: int


@dataclass
class Outcome:
    name: str
    returncode: int
    wall_s: float
    run_dir: Path
    kills: list[Kill] = field(default_factory=list)
    step_times: list[tuple[float, int]] = field(default_factory=list)  # (s, steps) seen

    def first_step_s(self) -> float | None:
        return self.step_times[0][0] if self.step_times else None

    def longest_gap(self) -> tuple[float, int]:
        """The longest wall time between two new steps, from the first on, and the step
        the stretch ended at."""
        start, end, at_step = self.longest_stretch()
        return end - start, at_step

    def longest_stretch(self) -> tuple[float, float, int]:
        """When the longest stretch without a new step began and ended, and its last step."""
        pairs = zip(self.step_times, self.step_times[1:], strict=False)
        return max(((a[0], b[0], b[1]) for a, b in pairs), key=lambda s: s[1] - s[0],
                   default=(0.0, 0.0, 0))  # fmt: skip

    def kills_between(self, start: float, end: float) -> str:
        """The kills from ``start`` to ``end``, each with its time after ``start``."""
        inside = [k for k in self.kills if start <= k.at_s <= end]
        return ", ".join(f"{k.name} +{k.at_s - start:.1f}" for k in inside) or "none"


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def children(parent: int) -> dict[int, str]:
    """The live child processes of ``parent`` (pid -> a name from their command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) != parent or fields[0] == "Z":
            continue
        found[int(entry.name)] = _name(cmdline)
    return found


def _name(cmdline: list[bytes]) -> str:
    words = [w.decode(errors="replace") for w in cmdline]
    if any(w.endswith(("scheduler.cli", "cli.scheduler")) for w in words):  # now, before
        return "scheduler"
    for flag in ("--role", "--rank"):
        if flag in words:
            role = words[words.index(flag) + 1]
            return role if flag == "--role" else f"rank-{role}"
    return "worker"


def run(name: str, work: Path, steps: int, overrides: list[str], kill: tuple[float, float] | None,
        rng: random.Random, config: Path = CONFIG) -> Outcome:  # fmt: skip
    run_dir = work / name
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c", str(config),
            f"run.dir={run_dir}", f"run.name={name}", f"run.total_steps={steps}",
            "scheduler.control_port=0", "scheduler.events_port=0", *overrides]  # fmt: skip
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    outcome = Outcome(name, -1, 0.0, run_dir)
    killer = None
    if kill is not None:
        killer = threading.Thread(target=_kill_loop, args=(proc, outcome, kill, rng, started))
        killer.start()
    watcher = threading.Thread(target=_watch_steps, args=(proc, outcome, started))
    watcher.start()
    outcome.returncode = proc.wait()
    outcome.wall_s = time.monotonic() - started
    watcher.join()
    if killer is not None:
        killer.join()
    return outcome


def _watch_steps(proc: subprocess.Popen[bytes], outcome: Outcome, started: float) -> None:
    """When each new step shows in metrics.jsonl, by this process's clock: the scheduler's
    own elapsed_s starts over with each scheduler it restarts."""
    path, seen = outcome.run_dir / "metrics.jsonl", 0
    while proc.poll() is None:
        try:
            count = path.read_bytes().count(b"\n")
        except FileNotFoundError:
            count = 0
        if count > seen:
            seen = count
            outcome.step_times.append((time.monotonic() - started, count))
        time.sleep(0.2)


def _kill_loop(proc: subprocess.Popen[bytes], outcome: Outcome, every: tuple[float, float],
               rng: random.Random, started: float) -> None:  # fmt: skip
    while proc.poll() is None:
        time.sleep(rng.uniform(*every))
        live = children(proc.pid)
        if not live or proc.poll() is not None:
            continue
        pid = rng.choice(sorted(live))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        steps = lines(outcome.run_dir / "metrics.jsonl")
        done = steps[-1]["step"] if steps else 0
        outcome.kills.append(Kill(round(time.monotonic() - started, 1), live[pid], pid, done))
        print(f"  kill -9 {live[pid]:>10} (pid {pid}) at step {done}, "
              f"{outcome.kills[-1].at_s:.1f} s", flush=True)  # fmt: skip


def final_val(run_dir: Path) -> float | None:
    vals = lines(run_dir / "validation.jsonl")
    return vals[-1]["val_reward"] if vals else None


def group_fates(run_dir: Path) -> dict[str, Any]:
    """Groups created, trained, filtered and dead, why each died, and every state's
    count, from the run's journal."""
    summary = replay_journal(RunDir(run_dir))
    groups = summary["groups"]
    return {
        "created": summary["created"],
        "trained": groups.get("trained", 0),
        "filtered": groups.get("filtered", 0),
        "dead": groups.get("dead", 0),
        "why_dead": summary["dead"],
        "states": groups,
    }


def check(outcome: Outcome, steps: int, baseline: float | None, max_gap: float) -> list[str]:
    problems = []
    fates = group_fates(outcome.run_dir)
    print(f"  groups: {fates['created']} created, {fates['trained']} trained, "
          f"{fates['filtered']} filtered, {fates['dead']} dead")  # fmt: skip
    if fates["dead"]:
        problems.append(f"groups died: {fates['why_dead']}")
    if sum(fates["states"].values()) != fates["created"]:  # each group in one state, once
        problems.append(f"group states {fates['states']} do not add up to {fates['created']}")
    gap, at_step = outcome.longest_gap()
    print(f"  first step after {outcome.first_step_s() or 0:.1f} s; longest stretch without "
          f"a step after it: {gap:.1f} s (ending at step {at_step})")  # fmt: skip
    start, end, _ = outcome.longest_stretch()
    print(f"  kills in that stretch (s after its start): {outcome.kills_between(start, end)}")
    if gap > max_gap:
        problems.append(f"{gap:.1f} s without a step (at step {at_step}), over {max_gap:g} s")
    if outcome.returncode != 0:
        problems.append(f"asyncrl run exited {outcome.returncode}")
    metrics = lines(outcome.run_dir / "metrics.jsonl")
    numbers = [m["step"] for m in metrics]
    if numbers != list(range(1, steps + 1)):
        problems.append(f"steps in metrics.jsonl are not 1..{steps} once each")
    trained = Counter(key for m in metrics for key in m.get("keys", []))
    twice = sorted(k for k, n in trained.items() if n > 1)
    if twice:
        problems.append(f"groups trained twice: {twice[:5]}")
    if trained and len(trained) != fates["trained"]:  # a filtered one trained would show
        problems.append(
            f"{len(trained)} keys trained by the steps, {fates['trained']} in the journal"
        )
    redone = sorted(k for k in trained if "#rollback" in k)
    if redone:
        problems.append(f"groups trained again after a rollback: {len(redone)}")
    logs = outcome.run_dir / "logs"
    restores = [r for p in sorted(logs.glob("train-*.log")) for r in _events(p, _RESTORED)]
    later = restores[1:]  # the first start takes the base model
    sources = Counter(r["source"] for r in later)
    print(f"  trainer restores: {len(later)}, from {dict(sorted(sources.items()))}")
    rolled = [r for p in sorted(logs.glob("*.log")) for r in _events(p, _ROLLED_BACK)]
    if rolled:  # a restart that resumed below the step count: steps were lost
        problems.append(f"training rolled back: {rolled[:3]}")
    val = final_val(outcome.run_dir)
    # One-sided: the kills must not cost learning; ending higher is the validation's noise.
    if baseline is not None and (val is None or val < baseline - VAL_TOLERANCE):
        problems.append(
            f"final validation reward {val} is more than {VAL_TOLERANCE} below {baseline}"
        )
    left = _pids_mentioning(str(outcome.run_dir))
    if left:
        problems.append(f"processes left: {left}")
    staged = RunDir(outcome.run_dir).staged_state
    if staged.exists():
        problems.append(f"the trainer's staged state left in {staged}")
    return problems


_RESTORED, _ROLLED_BACK = "trainer state restored", "training rolled back"


def _events(log: Path, event: str) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            record = json.loads(line)
            if record.get("event") == event:
                found.append(record)
    return found


def _pids_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", type=Path, default=CONFIG)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=float, nargs=2, default=(2.0, 6.0))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-gap", type=float, default=30.0, help="seconds allowed without a new step"
    )
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument(
        "--baseline-val",
        type=float,
        default=None,
        help="the undisturbed run's final validation reward, measured before: skip that run",
    )
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="section.key=value for both runs")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="kill-anything-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    baseline = args.baseline_val
    if not args.no_baseline and baseline is None:
        print(f"undisturbed run, {args.steps} steps ...", flush=True)
        calm = run("undisturbed", work, args.steps, args.overrides, None, rng, args.config)
        baseline = final_val(calm.run_dir)
        print(f"  exit {calm.returncode}, {calm.wall_s:.0f} s, final validation {baseline}")
    print(f"disturbed run: kill -9 every {args.every[0]:g}-{args.every[1]:g} s ...", flush=True)
    wild = run("disturbed", work, args.steps, args.overrides, tuple(args.every), rng, args.config)
    by_role = Counter(k.name for k in wild.kills)
    print(f"  exit {wild.returncode}, {wild.wall_s:.0f} s, {len(wild.kills)} kills: "
          + ", ".join(f"{name} {n}" for name, n in sorted(by_role.items())))  # fmt: skip
    print(f"  final validation {final_val(wild.run_dir)} (undisturbed {baseline})")
    (work / "kills.json").write_text(json.dumps([k.__dict__ for k in wild.kills], indent=1))
    problems = check(wild, args.steps, baseline, args.max_gap)
    for problem in problems:
        print(f"FAILED: {problem}")
    if not problems:
        print("every step once, every group trained once, no group dead, no trainer step lost")
    print(f"(runs kept in {work})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
