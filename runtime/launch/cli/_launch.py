"""``asyncrl launch``: a run on a cluster, placed by the cluster's own engine.

    asyncrl launch --on slurm|kubernetes -c run.yaml [overrides] [--dry-run]
    asyncrl launch --on ray -c run.yaml [overrides] [--address HOST:PORT] [--dry-run]

The config's ``placement`` says what runs where (runtime/contract/config/placement.py); the
engine's renderer turns it into its script (runtime/launch/clusters/slurm.py) or its objects
(runtime/launch/clusters/kubernetes_objects.py), printed by ``--dry-run``, submitted
otherwise. On Ray it becomes actors (runtime/launch/clusters/ray_plan.py), which the
launcher starts and follows to the run's end (runtime/launch/clusters/ray_launch.py).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from asyncrl.runtime.contract.commands import (
    UsageError,
    add_config_arguments,
    config_from_args,
    require_extras,
)

__all__ = ["add_launch_parser"]

ENGINES = ("slurm", "ray", "kubernetes")


def _launch(args: argparse.Namespace) -> int:
    from asyncrl.runtime.contract.rundir import RunDir
    from asyncrl.runtime.launch.clusters.slurm import job_output, render_sbatch

    if args.on == "kubernetes":
        return _on_kubernetes(args)
    if args.on == "ray":
        return _on_ray(args)
    cfg = config_from_args(args)
    cwd = Path.cwd()
    config_args = [*(["-c", str(args.config.resolve())] if args.config else []), *args.overrides]
    node_argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "node", *config_args]
    try:
        script = render_sbatch(cfg, node_argv, cwd)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.dry_run:
        print(script, end="")
        return 0
    if shutil.which("sbatch") is None:
        raise UsageError("sbatch is not on PATH: run asyncrl launch --on slurm on a Slurm "
                         "login node (or --dry-run to see the script)")  # fmt: skip
    run = RunDir(cwd / RunDir.of(cfg).root)
    run.logs.mkdir(parents=True, exist_ok=True)  # Slurm writes the job's output there
    path = run.root / "launch" / "slurm.sbatch"
    path.parent.mkdir(exist_ok=True)
    path.write_text(script)
    done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()  # its last line is the reason it gave up
        raise UsageError(f"sbatch {path} failed: {said[-1] if said else done.returncode}")
    job = done.stdout.strip().split(";")[0]
    output = str(job_output(cfg, cwd)).replace("%j", job)
    print(f"submitted job {job} ({path}); its output: {output}; workers' logs: {run.logs}")
    return 0


def _on_kubernetes(args: argparse.Namespace) -> int:
    from asyncrl.runtime.launch.clusters.kubectl import KubectlError, launch_on_kubernetes

    cfg = config_from_args(args)
    try:
        return launch_on_kubernetes(cfg, Path.cwd(), dry_run=args.dry_run)
    except (ValueError, KubectlError) as error:
        raise UsageError(str(error)) from None


def _on_ray(args: argparse.Namespace) -> int:
    from asyncrl.runtime.launch.clusters.ray_launch import RayLaunchError, launch_on_ray
    from asyncrl.runtime.launch.clusters.ray_plan import describe_plan, ray_plan

    try:
        plan = ray_plan(args.config, args.overrides, Path.cwd(), sys.executable)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.dry_run:
        print(describe_plan(plan), end="")
        return 0
    require_extras(plan.cfg)  # before any process starts
    try:
        return launch_on_ray(plan, args.address)
    except RayLaunchError as error:
        raise UsageError(str(error)) from None


def add_launch_parser(commands: argparse._SubParsersAction) -> None:
    launch = commands.add_parser(
        "launch", help="run on a cluster as its placement says (Slurm, Kubernetes, Ray)",
        description="Render the config's placement for a cluster's engine and start it: "
        "for slurm, an sbatch script with one srun step per node running that node's "
        "asyncrl node, the scheduler on the batch host, --requeue resuming the journal; for "
        "kubernetes, a pod per node (kubectl apply) and the run's keys as a Secret; for ray, "
        "every process a Ray actor (the scheduler on the head node), followed to the run's "
        "end.",
    )  # fmt: skip
    launch.add_argument("--on", required=True, choices=ENGINES, help="the cluster's engine")
    add_config_arguments(launch)
    launch.add_argument("--dry-run", action="store_true",
                        help="print what would be submitted, and submit nothing")  # fmt: skip
    launch.add_argument("--address", metavar="HOST:PORT",
                        help="ray: the cluster's address (default: RAY_ADDRESS, else the "
                        "cluster this machine is in)")  # fmt: skip
    launch.set_defaults(handler=_launch)
