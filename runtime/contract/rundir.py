"""Where a run keeps its files. Every process finds them through this one layout.

A run directory is private: made 0700, and every asyncrl command runs under a umask that
adds 077 to the user's (:func:`private_files`), so what its processes write there (journal,
logs, metrics, checkpoints, keys) is 0600 at most; a stricter umask is kept. Prompts and
model outputs are in the journal and the logs, and nobody else need read them.

Files that steer a process (where the scheduler listens, where the generators' APIs are)
are read through :func:`read_owned`: trusted only if this user owns them and nobody else
may write or read them, as ``run.secret``. See the README's Security section for what each
file of a run directory is trusted for.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl.runtime.contract.config import RunConfig, WeightsSection
    from asyncrl.transport.weights import WeightDirs

__all__ = ["RunDir", "UntrustedFile", "private_files", "read_owned", "write_private"]

_OTHERS = 0o077


class UntrustedFile(ValueError):
    """A file of the run directory that another user could have written, or one that is
    not whole; the message names it, why, and what to do."""


def read_owned(path: Path, max_bytes: int = 1 << 16) -> bytes:
    """The bytes of ``path``, if this user owns it and nobody else may open it (0600 or
    stricter) and it is a plain file, not a link; UntrustedFile otherwise.
    FileNotFoundError if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UntrustedFile(f"{path} is a symbolic link: not trusted; remove it") from None
        raise
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFile(f"{path} is not a plain file: not trusted; remove it")
        if info.st_uid != os.getuid():
            raise UntrustedFile(
                f"{path} belongs to uid {info.st_uid}, not to this user ({os.getuid()}): "
                f"not trusted; remove it"
            )
        if info.st_mode & _OTHERS:
            raise UntrustedFile(
                f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}, 0600 "
                f"expected): not trusted; remove it"
            )
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UntrustedFile(f"{path} holds more than {max_bytes} bytes: not trusted")
    return data


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path`` by rename, 0600 from creation (readers check: read_owned)."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)  # O_EXCL below: never through a link planted there
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def private_files() -> Iterator[None]:
    """Within: files this process makes are for its user only (the umask gains 077, never
    loses a bit the user set), as PostgreSQL's server does for its data directory."""
    before = os.umask(_OTHERS)
    os.umask(before | _OTHERS)
    try:
        yield
    finally:
        os.umask(before)


@dataclass(frozen=True, slots=True)
class RunDir:
    root: Path
    keys_dir: str = "{run.dir}/keys"  # scheduler.keys_dir as configured (this is its default)

    @classmethod
    def of(cls, cfg: RunConfig) -> RunDir:
        """The directory ``cfg`` runs in (``run.dir``), with its configured key directory."""
        return cls(Path(cfg.run.dir), cfg.scheduler.keys_dir)

    def make(self) -> None:
        """Create the run directory, open to its user only (0700). One that exists keeps
        its mode: whoever opened it to others did so on purpose."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    @property
    def config(self) -> Path:
        """The resolved configuration the run was started with."""
        return self.root / "config.yaml"

    @property
    def endpoints(self) -> Path:
        """Where the scheduler serving this run listens; present only while it runs."""
        return self.root / "endpoints.json"

    @property
    def finished(self) -> Path:
        """Written by the scheduler as it exits with the run finished: its step count."""
        return self.root / "finished.json"

    @property
    def bus_sockets(self) -> Path:
        """Where a local run's ipc:// bus sockets live: a directory only this user may open.

        Not inside the run directory: a socket path must fit in 107 bytes, and run
        directories can be deep. Its name comes from the run directory's real path, so
        every process of the run finds the same one.
        """
        runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/asyncrl-{os.getuid()}"
        digest = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:16]
        return Path(runtime) / f"asyncrl-bus-{digest}"

    def group_leader(self, role: str) -> Path:
        """Where the leader of ``role``'s group of ranks says it listens, when the group's
        ranks are on several machines (gangs.announce_leader)."""
        return self.root / "groups" / f"{role}.json"

    @property
    def secret(self) -> Path:
        """The run's secret (0600): its workers' keys and its fences derive from it."""
        return self.root / "run.secret"

    @property
    def keys(self) -> Path:
        """The CurveZMQ key pairs (``scheduler.keys_dir``, ``{run.dir}`` expanded)."""
        return Path(self.keys_dir.replace("{run.dir}", str(self.root)))

    @property
    def journal(self) -> Path:
        return self.root / "journal"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def validation(self) -> Path:
        return self.root / "validation.jsonl"

    @property
    def weight_loads(self) -> Path:
        """Each generator's report of each weight version it fetched and loaded."""
        return self.root / "weights.jsonl"

    @property
    def api_servers(self) -> Path:
        """Where each generator serving harnesses says where its API is and with what key
        (one file per worker, 0600, present while it serves)."""
        return self.root / "api-servers"

    @property
    def rollouts(self) -> Path:
        """The rollout dumps (``run.dump_rollouts``): every trained and filtered sample as
        a JSON line, files laid out and read by :mod:`.rollout_dumps`."""
        return self.root / "rollouts"

    @property
    def trace(self) -> Path:
        """Leases, weight versions and train steps as Chrome trace events (trace.py)."""
        return self.root / "trace.json"

    @property
    def report(self) -> Path:
        """Where ``asyncrl report`` writes its page and pictures."""
        return self.root / "report"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        """Where the trainer's checkpoint after ``step`` optimizer steps goes."""
        return _step_dir(self.checkpoints, step)

    def latest_checkpoint(self, at_most: int | None = None) -> Path | None:
        """The newest complete checkpoint (a checkpoint appears whole, by rename), if any;
        with ``at_most``, the newest of at most that many steps."""
        steps = [s for s in self.checkpoint_steps() if at_most is None or s <= at_most]
        return self.checkpoint(max(steps)) if steps else None

    def checkpoint_steps(self) -> list[int]:
        """The steps there are complete checkpoints of, oldest first."""
        return _steps_in(self.checkpoints)

    @property
    def critic_checkpoints(self) -> Path:
        """The learned critic's own checkpoints (``step-N``, as the trainer's) and, when its
        worker stops, the critic as it stopped (``final``)."""
        return self.root / "critic"

    def critic_checkpoint(self, step: int) -> Path:
        """Where the critic's checkpoint after ``step`` critic steps goes."""
        return _step_dir(self.critic_checkpoints, step)

    def critic_checkpoint_steps(self) -> list[int]:
        """The critic steps there are complete critic checkpoints of, oldest first."""
        return _steps_in(self.critic_checkpoints)

    @property
    def final_critic(self) -> Path:
        """The critic as its worker last stopped (at the end of the run: the final critic)."""
        return self.critic_checkpoints / "final"

    @property
    def staged_state(self) -> Path:
        """Where the trainer stages its state after each step: the run's own directory in
        RAM-backed /dev/shm (beside the weight plane's), else in the run directory.

        Named from the run directory's real path, so a restarted trainer finds it and
        another run never does."""
        return self._staged("trainer")

    @property
    def critic_staged_state(self) -> Path:
        """Where the critic stages its state after each step (as the trainer does)."""
        return self._staged("critic")

    def _staged(self, learner: str) -> Path:
        digest = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:12]
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            return shm / f"asyncrl-{os.getuid()}-{digest}-{learner}"
        return self.root / f"{learner}-state"

    @property
    def evaluations(self) -> Path:
        """Where ``asyncrl eval`` writes by default: a directory per checkpoint, each with
        its ``eval.jsonl`` (a line per evaluation) and the samples of the latest."""
        return self.root / "eval"

    @property
    def final_model(self) -> Path:
        """The trained model after the last step, as a Hugging Face directory."""
        return self.root / "final"

    def weight_dirs(self, weights: WeightsSection) -> WeightDirs:
        """Where the weight plane keeps files: versions of the files strategy here, slot
        files in ``weights.shm_dir``, else RAM-backed /dev/shm, else here on disk."""
        # Imported here: the weight plane brings torch, which the scheduler never loads.
        from asyncrl.transport.weights import WeightDirs
        from asyncrl.transport.weights.shm import ram_directory

        if weights.shm_dir:
            shared = Path(weights.shm_dir)
        else:
            # On disk the slot files are still shared, through the page cache.
            shared = ram_directory(self.root) or self.root / "weights-shm"
        return WeightDirs(files=self.root / "weights", shared=shared)

    def critic_weight_dirs(self, weights: WeightsSection) -> WeightDirs:
        """Where the weight plane keeps the learned critic's versions: inside the policy's
        directories, never in them, since a publisher starting on a directory removes the
        slot files nobody holds (the trainer's would go)."""
        policy = self.weight_dirs(weights)
        return type(policy)(files=policy.files / "critic", shared=policy.shared / "critic")


def _step_dir(directory: Path, step: int) -> Path:
    return directory / f"step-{step:07d}"


def _steps_in(directory: Path) -> list[int]:
    """The steps of the ``step-N`` directories in ``directory``, oldest first."""
    steps = []
    for path in directory.glob("step-*"):
        number = path.name.removeprefix("step-")
        if number.isdigit():
            steps.append(int(number))
    return sorted(steps)
