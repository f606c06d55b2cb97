"""Benchmark: one scheduler under N simulated workers, the growth curve.

    python -m tests.bench.scale [--workers 16,64,256,1024] [--seconds 20] [--hosts 2]
                                [--mean-lease 1.0] [--claim-apart]

The real scheduler daemon (journal on, the default pipeline's stage table) serves N
simulated workers that speak the real protocol over real ZeroMQ sockets, one DEALER each
under its worker key: Hello, heartbeats naming the leases held, claims, completions
carrying data-plane references and Held for them, and the worker's next claim as a real
worker's do (``--claim-apart``: a Claim of its own after each, as before Complete carried
one), the trainer's PublishVersion, each generator's and logp worker's WantWeights and
LoadedVersion for every new version (an idle one's report carrying its next claim, as a
real one's does) and the weights report it sends before its next completion; a dataloader
answering Want with AddGroups. The scheduler logs as in a run (info, to
``logs/scheduler.log`` in its run directory). They are
hosted many to a process (asyncio, ``--hosts`` processes, their collector set as a real
worker's is). Idle workers wait for the wake-up events of their role (one SUB per host
process stands in for each worker's own) or a slow poll, as real ones do; a version
published wakes the roles that load versions. Workers begin within a mean lease of the
window's start, as a fleet comes up over time rather than at one instant.

Each lease takes a time drawn like a real run's, scaled: generation long-tailed
(log-normal, mean ``--mean-lease``), scoring and reward a fifth of that, a train step
half of it (a step trains what the generators made in a mean lease, so the trainer keeps
up and the staleness bound never holds generation back). Per N, the scheduler alone
first (its floor: ticks, flushes), then two phases: heartbeats only (every worker
registered, idle), then work. Printed per N:
leases granted/s, claim-to-lease latency p50/p99 (the worker's clock, from sending the
request that asks for work, a Claim or a Complete carrying the next claim, to reading the
Lease), the scheduler's CPU per lease and per heartbeat (from its
own threads' schedstat, so the load generator beside it does not blur them; its floor
taken off; Held and version requests count with the leases), its RSS, journal bytes per
group, the share of ideal work: the time generators held leases over the time they
ran (an infinitely fast scheduler keeps them at 100%), and the requests a lease costs:
Claims, and Claims and Completes together.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio

from asyncrl.runtime.contract.config import config_from_dict, dump_config, load_config
from asyncrl.runtime.contract.gc_policy import settle_after_startup
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport import protocol as p
from asyncrl.transport.identity import connection_identity, load_run_secret, worker_key
from asyncrl.transport.topics import Topic, topic, wake_topic

HEARTBEAT_S = 2.0  # scheduler.heartbeat_interval_s's default
SLOW_POLL_S = 1.0  # an idle worker claims again after this long without a wake-up
# The roles that load every version the trainer publishes (and hear of it: the others do
# not subscribe to version.published).
FOLLOWERS = frozenset({"generate", "logp"})
# A follower's weights report after each load, with the fields a real one's carries
# (actors/worker/weight_following.py); the bench moves no bytes.
LOAD_COST = {"transfer_s": 0.0, "load_s": 0.0, "stall_s": 0.0, "bytes": 0, "mb_per_s": 0.0,
             "source": "train-1", "attempts": 1, "retried_buckets": 0}  # fmt: skip


def roles_for(n: int) -> list[str]:
    """The role of each of ``n`` workers: one dataloader and one trainer, the rest half
    generators and half scorers (logp) and reward workers (the default pipeline has no
    ref_logp stage: no KL penalty)."""
    rest = max(3, n - 2)
    gen = max(1, rest // 2)
    logp = max(1, (rest - gen) // 2)
    return (
        ["dataloader", "train"]
        + ["generate"] * gen
        + ["logp"] * logp
        + ["reward"] * (rest - gen - logp)
    )


# The pipeline's own bound is loosened by default: with max_staleness 2, generators wait
# for the trainer whenever a long-tailed lease holds a step back, however fast the
# scheduler (16 workers: 94% busy; 64: 72%), and the curve would measure the pipeline,
# not the scheduler. 32 versions outlast the longest lease drawn (a step a mean lease;
# log-normal, sigma 1: one lease in 10^5 passes 20 means), yet keep the prompts waiting
# bounded (train_batch_groups x (max_staleness + 2)). Every grant still goes through the
# bound's check, at the same cost.
LOOSE_STALENESS = 32


def scheduler_config(
    run_dir: Path,
    generators: int,
    mean_lease: float,
    busy_poll_us: int | None = None,
    max_staleness: int = LOOSE_STALENESS,
) -> dict:
    # A step trains what the generators make in about a step's time, so the trainer keeps up.
    batch = max(8, int(generators / mean_lease))
    pipeline = {"max_staleness": max_staleness, "train_batch_groups": batch,
                "lease_timeout_s": 60.0}  # fmt: skip
    return {
        "run": {"dir": str(run_dir), "total_steps": 1_000_000_000},
        "pipeline": pipeline,
        "scheduler": {"worker_timeout_s": 60.0}
        | ({} if busy_poll_us is None else {"busy_poll_us": busy_poll_us}),
    }  # logging as a run's: at info, to a file (the bench's terminal shows only its table)


# --- one simulated worker ------------------------------------------------------------


@dataclass
class Tally:
    leases: int = 0
    heartbeats: int = 0
    claims: int = 0
    completes: int = 0
    busy_s: float = 0.0  # generators: time holding leases
    ran_s: float = 0.0  # generators: time from their first claim to the window's end
    latencies: list[float] = field(default_factory=list)  # claim -> lease, seconds
    errors: list[str] = field(default_factory=list)


class SimWorker:
    def __init__(self, host: Host, name: str, role: str) -> None:
        self.host, self.name, self.role = host, name, role
        secret = load_run_secret(RunDir(host.run_dir).secret)
        identity = connection_identity(name, worker_key(secret, name, role))
        self.sock = host.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, identity.encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(host.control)
        self.pending: dict[int, asyncio.Future[p.Message]] = {}
        self.next_id = 0
        self.held: set[int] = set()
        self.kept: set[int] = set()  # payload keys acknowledged, asked about with heartbeats
        self.version = 0
        self.report: p.Report | None = None  # the last load's cost, sent before a Complete
        self.wake = asyncio.Event()
        self.rng = random.Random(name)
        self.store = f"store-{name}"

    async def read(self) -> None:
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            reply, req_id = p.decode_with_id([f.buffer for f in frames])
            future = self.pending.pop(req_id, None)
            if future is not None and not future.done():
                future.set_result(reply)

    async def ask(self, message: p.Message) -> p.Message:
        self.next_id += 1
        future: asyncio.Future[p.Message] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = future
        await self.sock.send_multipart(p.encode(message, self.next_id), copy=False)
        return await asyncio.wait_for(future, 60)

    async def heartbeats(self, tally: Tally) -> None:
        await asyncio.sleep(self.rng.uniform(0, HEARTBEAT_S))
        while True:
            await self.ask(p.Heartbeat(self.name, tuple(sorted(self.held))))
            tally.heartbeats += 1
            if self.kept:  # as a real holder does: which of mine may I free?
                keys = tuple(sorted(self.kept))
                drop = await self.ask(p.Held(self.name, self.store, keys, 65536 * len(keys)))
                if isinstance(drop, p.Drop):
                    self.kept.difference_update(drop.keys)
            await asyncio.sleep(HEARTBEAT_S)

    async def hello(self) -> None:
        ready = await self.ask(p.Hello(self.name, self.role, p.PROTOCOL_VERSION, os.getpid()))
        assert isinstance(ready, p.Ready), ready
        if self.role in FOLLOWERS:
            await self.load(ready.policy_version)

    async def load(self, version: int, tally: Tally | None = None) -> p.Lease | None:
        """Load ``version``; with a ``tally``, the report carries the worker's next claim
        (it holds no lease), and the lease it got, if any, is returned."""
        if version > 0:
            await self.ask(p.WantWeights(self.name, version))  # a plan, or nothing held yet
        claim = 1 if tally is not None else 0
        sent = time.perf_counter()
        reply = await self.ask(p.LoadedVersion(self.name, version, claim))
        self.version = version
        if version > 0:  # what a real follower reports with its next completion
            self.report = p.Report(self.name, "weights", version, dict(LOAD_COST))
        if tally is None:
            return None
        tally.claims += 1
        return self.granted(reply, sent, tally) if isinstance(reply, p.Lease) else None

    async def idle(self) -> None:
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), SLOW_POLL_S)

    async def work(self, tally: Tally, until: float) -> None:
        host = self.host
        if self.role != "dataloader":
            # A fleet's workers come up over time (their processes start, their models load),
            # not all at one instant: each begins within a mean lease of the window's start.
            await asyncio.sleep(self.rng.uniform(0, host.mean_lease))
        self.since = time.time()
        if self.role == "generate":
            tally.ran_s += max(0.0, until - self.since)
        lease: p.Lease | None = None  # one granted with the last completion
        while time.time() < until:
            if self.role in FOLLOWERS and host.version > self.version:
                if lease is None and self.claims_next:  # idle: it claims with the report
                    lease = await self.load(host.version, tally)
                    if lease is None:
                        await self.idle()  # queued to be woken, as after an empty claim
                        continue
                else:
                    await self.load(host.version)
            if self.role == "dataloader":
                await self.feed()
                continue
            if lease is None:
                sent = time.perf_counter()
                reply = await self.ask(p.Claim(self.name, self.role, 1))
                tally.claims += 1
                if not isinstance(reply, p.Lease):
                    if isinstance(reply, p.Error):
                        tally.errors.append(reply.detail)
                    await self.idle()
                    continue
                lease = self.granted(reply, sent, tally)
            self.held.add(lease.lease_id)
            began = time.time()
            await asyncio.sleep(self.duration())
            if self.role == "generate":  # the part of the lease inside the window
                tally.busy_s += max(0.0, min(time.time(), until) - max(began, self.since))
            done, lease = lease, await self.complete(lease, tally, until)
            self.held.discard(done.lease_id)
            if lease is None and self.claims_next:
                await self.idle()  # queued to be woken, as after a claim that found nothing
        if lease is not None:  # granted as the window closed: handed back, as on a stop
            await self.ask(p.Fail(self.name, lease.lease_id, lease.fence, None, "bench over"))

    @property
    def claims_next(self) -> bool:
        """Whether this worker's completions carry its next claim (a trainer's never do:
        it publishes the version its StepDone names first)."""
        return self.host.claim_next and self.role != "train"

    @staticmethod
    def granted(lease: p.Lease, sent: float, tally: Tally) -> p.Lease:
        tally.latencies.append(time.perf_counter() - sent)
        tally.leases += 1
        return lease

    def duration(self) -> float:
        mean = self.host.mean_lease
        if self.role == "generate":  # long-tailed: log-normal with sigma 1
            return self.rng.lognormvariate(math.log(mean) - 0.5, 1.0)
        if self.role == "train":  # faster than generation, so staleness never holds it back
            return mean / 2
        return self.rng.expovariate(5.0 / mean)

    async def complete(self, lease: p.Lease, tally: Tally, until: float) -> p.Lease | None:
        """Complete ``lease``; the next lease if the Complete asked for one (before
        ``until``) and got it."""
        results = []
        for item in lease.items:
            ref = p.PayloadRef(self.name, "tcp://127.0.0.1:1", self.store, item.gid,
                               65536, 0, "bench")  # fmt: skip
            behaviour = (lease.version, lease.version) if self.role == "generate" else None
            kept = None if self.role == "train" else ref  # a train step leaves nothing
            results.append(p.Result(item.gid, {}, behaviour, kept))
        durable = None
        if self.role == "train":
            durable = (lease.version or 0) + 1
        claim = 1 if self.claims_next and time.time() < until else 0
        if self.report is not None:  # a real worker sends its reports before its completions
            await self.ask(self.report)
            self.report = None
        sent = time.perf_counter()
        reply = await self.ask(
            p.Complete(self.name, lease.lease_id, lease.fence, tuple(results), None, durable,
                       claim)
        )  # fmt: skip
        tally.completes += 1
        if isinstance(reply, p.Ack | p.Lease) and self.role != "train":
            self.kept.update(item.gid for item in lease.items)
        if isinstance(reply, p.Lease):
            return self.granted(reply, sent, tally)
        if isinstance(reply, p.StepDone):
            await self.ask(p.PublishVersion(self.name, reply.version, {"bench": 1}, b"bench"))
        elif not isinstance(reply, p.Ack):
            tally.errors.append(str(reply))
        return None

    async def feed(self) -> None:
        reply = await self.ask(p.Claim(self.name, self.role, 4096))
        if isinstance(reply, p.Want) and reply.count:
            first = self.host.added
            self.host.added += reply.count
            groups = tuple(
                p.NewGroup(f"g{i}", {"prompt": i}) for i in range(first, first + reply.count)
            )
            await self.ask(p.AddGroups(self.name, groups))
        else:
            await self.idle()


# --- a host process of simulated workers ----------------------------------------------


class Host:
    def __init__(self, spec: dict) -> None:
        self.run_dir = Path(spec["run_dir"])
        self.control, self.events = spec["control"], spec["events"]
        self.mean_lease = spec["mean_lease"]
        self.claim_next = spec["claim_next"]
        self.ctx = zmq.asyncio.Context()
        # One DEALER per worker: past libzmq's 1,023 sockets a context refuses more.
        self.ctx.set(zmq.MAX_SOCKETS, len(spec["workers"]) + 64)
        self.version = 0
        self.added = spec["index"] * 10**9  # dataloader keys, apart per host
        self.workers = [SimWorker(self, name, role) for name, role in spec["workers"]]
        self.followers = [w for w in self.workers if w.role in FOLLOWERS]

    async def listen(self) -> None:
        """One SUB for the host's workers: the scheduler wakes a waiting worker by name
        (``wake.<worker>/``), as a real worker's own SUB hears it; the publisher sends
        one message per worker woken either way."""
        sub = self.ctx.socket(zmq.SUB)
        sub.connect(self.events)
        by_topic = {wake_topic(w.name): w for w in self.workers}
        for prefix in (topic(Topic.WAKE), "version.published", topic(Topic.RUN)):
            sub.setsockopt(zmq.SUBSCRIBE, prefix.encode())
        while True:
            frames = await sub.recv_multipart(copy=False)
            event = p.decode([f.buffer for f in frames[1:]])
            if not isinstance(event, p.Event):
                continue
            if event.topic == "version.published":
                self.version = max(self.version, int(event.body["version"]))
                woken = self.followers  # they load it, then claim: it may admit more now
            elif event.topic.startswith(topic(Topic.RUN)):
                woken = self.workers
            else:  # another host's worker, if not one of these
                woken = [by_topic[event.topic]] if event.topic in by_topic else []
            for w in woken:
                w.wake.set()

    async def run(self, phases: dict) -> dict:
        readers = [asyncio.create_task(w.read()) for w in self.workers]
        listener = asyncio.create_task(self.listen())
        for w in self.workers:
            await w.hello()
        settle_after_startup()  # the collector's settings of a real worker, after its start
        quiet, busy = Tally(), Tally()
        await _until(phases["heartbeats_from"])
        beating = [asyncio.create_task(w.heartbeats(quiet)) for w in self.workers]
        await _until(phases["work_from"])
        for task in beating:
            task.cancel()
        beating = [asyncio.create_task(w.heartbeats(busy)) for w in self.workers]
        until = phases["work_until"]
        await asyncio.gather(*(w.work(busy, until) for w in self.workers))
        for task in [*beating, *readers, listener]:
            task.cancel()
        return {"quiet": _summary(quiet), "busy": _summary(busy)}


def _summary(t: Tally) -> dict:
    return {"leases": t.leases, "heartbeats": t.heartbeats, "claims": t.claims,
            "completes": t.completes, "busy_s": t.busy_s, "ran_s": t.ran_s,
            "latencies": t.latencies,
            "errors": t.errors[:5]}  # fmt: skip


async def _until(when: float) -> None:
    await asyncio.sleep(max(0.0, when - time.time()))


def host_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    result = asyncio.run(Host(spec).run(spec["phases"]))
    print(json.dumps(result))


# --- the driver ----------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` so far, to the nanosecond (schedstat; the
    clock ticks of /proc/PID/stat are 10 ms, coarser than a few heartbeats)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended
    return total / 1e9


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Point:
    workers: int
    leases_per_s: float
    claims_per_lease: float  # claims sent per lease granted: the wake-up herd's size
    requests_per_lease: float  # claims and completes: what a lease costs in round trips
    p50_ms: float
    p99_ms: float
    cpu_per_lease_ms: float
    cpu_per_heartbeat_us: float
    rss_mb: float
    journal_bytes_per_group: float
    ideal_share: float
    scheduler_cores: float  # the scheduler's CPU over the work phase, in cores
    load_cores: float  # the simulated workers' host processes', together
    errors: list[str]
    loop: dict = field(default_factory=dict)  # the scheduler's timings of its loop's parts


@dataclass(frozen=True)
class Setting:
    seconds: float = 20.0
    hosts: int = 2
    mean_lease: float = 1.0
    busy_poll_us: int | None = None
    max_staleness: int = LOOSE_STALENESS
    claim_next: bool = True  # completions carry the next claim, as a real worker's do


def measure(n: int, setting: Setting, root: Path) -> Point:
    """One point of the curve, in a directory of its own under ``root`` (a size may be
    measured more than once in a run)."""
    seconds, hosts, mean_lease = setting.seconds, setting.hosts, setting.mean_lease
    root = Path(tempfile.mkdtemp(prefix=f"n{n}-", dir=root))
    run_dir = root / f"n{n}"
    roles = roles_for(n)
    generators = roles.count("generate")
    cfg_path = root / f"n{n}.yaml"
    cfg = config_from_dict(
        scheduler_config(
            run_dir, generators, mean_lease, setting.busy_poll_us, setting.max_staleness
        )
    )
    cfg_path.write_text(dump_config(cfg))
    control, events = f"ipc://{root}/n{n}-control.sock", f"ipc://{root}/n{n}-events.sock"
    serve = [sys.executable, "-m", __spec__.name, "--serve", str(cfg_path), control, events]
    # Its log where a run keeps it (logs/scheduler.log), written line by line at the
    # configured level (info by default) as in a run.
    log_path = RunDir(run_dir).logs / "scheduler.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        sched = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "endpoints.json").exists():
            if sched.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").splitlines()[-5:]
                raise SystemExit("the scheduler did not start:\n" + "\n".join(tail))
            time.sleep(0.05)
        idle_from, idle_cpu = time.time(), cpu_s(sched.pid)
        time.sleep(2.0)  # the scheduler alone, no worker yet: its floor (ticks, flushes)
        idle_rate = (cpu_s(sched.pid) - idle_cpu) / (time.time() - idle_from)
        names = [(f"{role}-{i}", role) for i, role in enumerate(roles)]
        start = time.time() + 5 + n / 200  # time for every host to connect and say Hello
        quiet_s = 2 * HEARTBEAT_S + 1
        phases = {"heartbeats_from": start, "work_from": start + quiet_s,
                  "work_until": start + quiet_s + seconds}  # fmt: skip
        procs = []
        for h in range(hosts):
            spec = {"run_dir": str(run_dir), "control": control, "events": events,
                    "config": str(cfg_path),
                    "mean_lease": mean_lease, "index": h, "phases": phases,
                    "claim_next": setting.claim_next,
                    "workers": names[h::hosts]}  # fmt: skip
            path = root / f"n{n}-host{h}.json"
            path.write_text(json.dumps(spec))
            host = [sys.executable, "-m", __spec__.name, "--host", str(path)]
            procs.append(subprocess.Popen(host, stdout=subprocess.PIPE))
        _sleep_until(phases["heartbeats_from"] + 0.2)
        cpu0 = cpu_s(sched.pid)
        _sleep_until(phases["work_from"] - 0.2)
        cpu1 = cpu_s(sched.pid)
        journal = JournalGrowth(RunDir(run_dir).journal)
        _sleep_until(phases["work_from"])
        cpu2, load0 = cpu_s(sched.pid), sum(cpu_s(proc.pid) for proc in procs)
        _sleep_until(phases["work_until"])
        cpu3, rss = cpu_s(sched.pid), rss_mb(sched.pid)
        load_cpu = sum(cpu_s(proc.pid) for proc in procs) - load0
        journal_bytes = journal.stop()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        loop = scheduler_loop(control)
    finally:
        sched.terminate()
        sched.wait(30)
    quiet_beats = sum(r["quiet"]["heartbeats"] for r in results)
    quiet_window = phases["work_from"] - 0.2 - (phases["heartbeats_from"] + 0.2)
    beats_in_window = quiet_beats * quiet_window / quiet_s
    per_beat = max(0.0, cpu1 - cpu0 - idle_rate * quiet_window) / max(1.0, beats_in_window)
    busy = [r["busy"] for r in results]
    leases = sum(b["leases"] for b in busy)
    beats = sum(b["heartbeats"] for b in busy)
    work_cpu = (cpu3 - cpu2) - per_beat * beats - idle_rate * seconds
    latencies = sorted(x for b in busy for x in b["latencies"])
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    groups = max(1, leases // 3)  # a group takes three leases (generate, logp, reward)
    gen_busy = sum(b["busy_s"] for b in busy)
    gen_ran = sum(b["ran_s"] for b in busy)
    return Point(
        workers=n,
        leases_per_s=leases / seconds,
        claims_per_lease=sum(b["claims"] for b in busy) / max(1, leases),
        requests_per_lease=sum(b["claims"] + b["completes"] for b in busy) / max(1, leases),
        p50_ms=cuts[49] * 1e3,
        p99_ms=cuts[98] * 1e3,
        cpu_per_lease_ms=1e3 * work_cpu / max(1, leases),
        cpu_per_heartbeat_us=1e6 * per_beat,
        rss_mb=rss,
        journal_bytes_per_group=journal_bytes / groups,
        ideal_share=gen_busy / max(gen_ran, 1e-9),
        scheduler_cores=(cpu3 - cpu2) / seconds,
        load_cores=load_cpu / seconds,
        errors=[e for b in busy for e in b["errors"]][:3],
        loop=loop,
    )


def scheduler_loop(control: str) -> dict:
    """The scheduler's own timings of its loop's parts (its status reply's ``loop``)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(control)
    try:
        sock.send_multipart(p.encode(p.Status(), 1))
        if not sock.poll(10_000):
            return {}
        reply = p.decode([bytes(f) for f in sock.recv_multipart()])
        return reply.summary.get("loop", {}) if isinstance(reply, p.StatusReply) else {}
    finally:
        sock.close()


def slowest_parts(loop: dict, top: int = 6) -> str:
    """The parts of the scheduler's turns that took longest, for the line under a row."""
    parts = sorted(loop.items(), key=lambda kv: -kv[1]["max_us"])[:top]
    return "; ".join(f"{name} n={h['count']} p99<{h['p99_us']}us max={h['max_us'] / 1e3:.1f}ms"
                     for name, h in parts)  # fmt: skip


class JournalGrowth:
    """Bytes appended to the journal's segments while it runs: their sizes polled, since a
    snapshot retires old segments (the last writes before a retirement may be missed)."""

    def __init__(self, journal: Path) -> None:
        self._journal = journal
        self._start = self._sizes()
        self._most = dict(self._start)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _sizes(self) -> dict[str, int]:
        found = {}
        for f in self._journal.glob("journal-*.log"):
            with contextlib.suppress(FileNotFoundError):
                found[f.name] = f.stat().st_size
        return found

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            for name, size in self._sizes().items():
                self._most[name] = max(size, self._most.get(name, 0))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        for name, size in self._sizes().items():
            self._most[name] = max(size, self._most.get(name, 0))
        return sum(size - self._start.get(name, 0) for name, size in self._most.items())


def _sleep_until(when: float) -> None:
    time.sleep(max(0.0, when - time.time()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="16,64,256,1024")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--mean-lease", type=float, default=1.0)
    parser.add_argument(
        "--busy-poll-us", type=int, help="scheduler.busy_poll_us (default: the config's)"
    )
    parser.add_argument(
        "--max-staleness", type=int, default=LOOSE_STALENESS,
        help=f"pipeline.max_staleness (default {LOOSE_STALENESS}: so loose that only the "
        "scheduler holds generators back)",
    )  # fmt: skip
    parser.add_argument(
        "--claim-apart", action="store_true",
        help="workers claim with a Claim of their own after each Complete, as before a "
        "Complete carried the next claim (to compare the two flows)",
    )  # fmt: skip
    parser.add_argument(
        "--loop-timings", action="store_true",
        help="print the slowest parts of the scheduler's turns under each row",
    )  # fmt: skip
    parser.add_argument("--plot", type=Path, help="draw the curve to this PNG")
    parser.add_argument("--serve", nargs=3, metavar=("CONFIG", "CONTROL", "EVENTS"))
    parser.add_argument("--host", metavar="SPEC")
    args = parser.parse_args()
    if args.serve:
        from asyncrl.runtime.contract.logs import configure_logging
        from asyncrl.runtime.scheduler.service.process import serve

        cfg = load_config(Path(args.serve[0]))
        configure_logging(process="scheduler", level=cfg.logging.level, fmt=cfg.logging.format)
        raise SystemExit(serve(cfg, resume=False, endpoints=(args.serve[1], args.serve[2])))
    if args.host:
        return host_main(args.host)
    setting = Setting(args.seconds, args.hosts, args.mean_lease, args.busy_poll_us,
                      args.max_staleness, not args.claim_apart)  # fmt: skip
    print(f"{args.seconds:g} s of work per N after {2 * HEARTBEAT_S + 1:g} s of heartbeats "
          f"only; mean lease {args.mean_lease:g} s; max_staleness {args.max_staleness}; "
          f"{args.hosts} host processes; {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.1f}; next claim "
          f"{'apart' if args.claim_apart else 'with each Complete'}")  # fmt: skip
    header = (f"{'N':>5} {'leases/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'CPU/lease':>10} "
              f"{'CPU/beat':>9} {'RSS':>7} {'journal/group':>13} {'ideal':>6} "
              f"{'sched cores':>11} {'load cores':>10} {'claims/lease':>12} "
              f"{'requests/lease':>14}")  # fmt: skip
    print(header)
    points = []
    with tempfile.TemporaryDirectory(prefix="asyncrl-scale-") as tmp:
        for n in (int(x) for x in args.workers.split(",")):
            pt = measure(n, setting, Path(tmp))
            points.append(pt)
            print(f"{pt.workers:>5} {pt.leases_per_s:>9.1f} {pt.p50_ms:>7.2f} {pt.p99_ms:>7.2f} "
                  f"{pt.cpu_per_lease_ms:>7.3f} ms {pt.cpu_per_heartbeat_us:>6.0f} us "
                  f"{pt.rss_mb:>4.0f} MB {pt.journal_bytes_per_group:>11.0f} B "
                  f"{pt.ideal_share:>6.0%} {pt.scheduler_cores:>11.2f} {pt.load_cores:>10.2f} "
                  f"{pt.claims_per_lease:>12.2f} {pt.requests_per_lease:>14.2f}",
                  flush=True)  # fmt: skip
            if pt.errors:
                print(f"      errors: {pt.errors}")
            if args.loop_timings:
                print(f"      slowest parts: {slowest_parts(pt.loop)}")
    if args.plot:
        from .scale_plot import plot

        plot(points, args.plot, setting.mean_lease)
        print(f"curve drawn to {args.plot}")


if __name__ == "__main__":
    main()
