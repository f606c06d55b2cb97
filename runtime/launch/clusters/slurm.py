"""``asyncrl launch --on slurm``: a run's placement as one sbatch script.

The batch script runs on the job's first node, the batch host: there it runs that
node's ``asyncrl node`` with the scheduler, and one ``srun`` step per other node runs
that node's, each with ``--gres=gpu:K`` (Slurm sets ``CUDA_VISIBLE_DEVICES``, which the
node's supervisor hands out). The nodes are Slurm's (``SLURM_JOB_NODELIST``); nothing
looks for addresses: every node finds the scheduler in the shared run directory.

``--requeue``: a job whose node fails is started again from the top of the script by
Slurm, and then resumes the run from the scheduler's journal (``--resume`` once the
journal exists), so every group is still trained exactly once.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.config.fields import CONTROL_CHARACTERS
from asyncrl.runtime.contract.rundir import RunDir

from .node_plan import NodeShare, cluster_nodes

__all__ = ["job_output", "render_sbatch"]


def job_output(cfg: RunConfig, cwd: Path) -> Path:
    """Where the job's output goes (``%j``: Slurm's job id)."""
    return _root(cfg, cwd) / "logs" / "slurm-%j.out"


def render_sbatch(cfg: RunConfig, node_argv: Sequence[str], cwd: Path) -> str:
    """The batch script; ``node_argv`` is ``asyncrl node`` with the run's config, as the
    nodes run it (the same code and paths on every node), ``cwd`` where it runs."""
    shares = cluster_nodes(cfg)
    root = _root(cfg, cwd)
    # sbatch reads #SBATCH lines up to the first command: a line break in a value would
    # end them there and run the rest of that value as shell.
    _one_line("run.name", cfg.run.name)
    _one_line("run.dir", cfg.run.dir)
    _one_line("the working directory (--chdir)", str(cwd))
    q = shlex.quote
    gpus = max(share.gpus for share in shares)
    head = [
        "#!/bin/bash",
        f"# {q(cfg.run.name)} over {len(shares)} node(s), from its placement (asyncrl launch)",
        f"#SBATCH --job-name={q('asyncrl-' + cfg.run.name)}",
        f"#SBATCH --nodes={len(shares)}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gres=gpu:{gpus}"] if gpus else []),
        "#SBATCH --requeue",
        f"#SBATCH --chdir={q(str(cwd))}",
        f"#SBATCH --output={q(str(job_output(cfg, cwd)))}",
        "#SBATCH --open-mode=append",
        *(f"#SBATCH {option}" for option in cfg.placement.sbatch),
    ]
    body = [
        "set -u",
        "# The job's nodes in Slurm's order; the first is this one, the batch host.",
        'mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        f"node=({' '.join(q(arg) for arg in node_argv)})",
        "# Started again by Slurm (--requeue): the run goes on from the scheduler's journal.",
        "resume=()",
        f"if [ -d {q(str(RunDir(root).journal))} ]; then resume=(--resume); fi",
        "# Slurm ended every process of an earlier start: its scheduler's address is stale.",
        f"rm -f {q(str(RunDir(root).endpoints))}",
        'echo "asyncrl launch: job $SLURM_JOB_ID on ${nodes[*]}${resume:+ (resumed)}"',
        "pids=()",
        *(_step(i, share, gpus) for i, share in enumerate(shares)),
        "status=0",
        'for pid in "${pids[@]}"; do wait "$pid" || status=$?; done',
        'exit "$status"',
    ]
    return "\n".join([*head, "", *body]) + "\n"


def _step(i: int, share: NodeShare, job_gpus: int) -> str:
    args = f"--roles {share.roles_arg()} --first-index {share.first_index}"
    if share.scheduler:
        return f'"${{node[@]}}" {args} "${{resume[@]}}" & pids+=($!)'
    # One task on the job's i-th node; a step's failure must not end the others' steps.
    gres = f" --gres=gpu:{share.gpus}" if share.gpus and job_gpus else ""
    return (f"srun --nodes=1 --ntasks=1 --relative={i}{gres} --kill-on-bad-exit=0 "
            f'"${{node[@]}}" {args} & pids+=($!)')  # fmt: skip


def _one_line(what: str, text: str) -> None:
    if CONTROL_CHARACTERS.search(text):
        raise ValueError(f"{what}: got {text!r}; allowed: one line without control characters")


def _root(cfg: RunConfig, cwd: Path) -> Path:
    return cwd / RunDir.of(cfg).root
