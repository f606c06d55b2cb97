"""``asyncrl node``: this machine's share of a run on several machines.

    asyncrl node -c run.yaml --roles scheduler,dataloader,reward,train   # the scheduler's
    asyncrl node -c run.yaml --roles generate=4 --first-index 4          # each other one

See runtime/launch/node.py for what it does, plan.py for what it starts.
"""

from __future__ import annotations

import argparse
import socket

from asyncrl.runtime.contract.commands import (
    UsageError,
    add_config_arguments,
    config_from_args,
    require_extras,
)

__all__ = ["add_node_parser"]


def _node(args: argparse.Namespace) -> int:
    # Imported when run: other commands start without the launcher's imports.
    from asyncrl.runtime.launch.gpus import machine_gpus
    from asyncrl.runtime.launch.node import NodeError, run_node
    from asyncrl.runtime.launch.plan import NodePlan, NodeRoles, parse_roles

    cfg = config_from_args(args)
    require_extras(cfg)  # before any process starts
    try:
        asked = parse_roles(args.roles, cfg) if args.roles else NodeRoles({}, False, {})
        roles, scheduler = asked.roles, asked.scheduler or args.with_scheduler
        if not (roles or scheduler):
            raise ValueError("give --roles (and --with-scheduler on the scheduler's machine)")
        if scheduler and args.scheduler:
            raise ValueError(
                "--scheduler names a scheduler on another machine, but this one runs it: "
                "it serves scheduler.host of the config"
            )
        node = args.node or socket.gethostname()
        plan = NodePlan(roles, scheduler, node, args.first_index, machine_gpus(cfg, args.gpus),
                        args.scheduler, asked.first_ranks)  # fmt: skip
    except ValueError as error:
        raise UsageError(str(error)) from None
    config_args = [*(["-c", str(args.config.resolve())] if args.config else []), *args.overrides]
    try:
        prog = f"asyncrl node {plan.node}"
        return run_node(cfg, config_args, plan, resume=args.resume, prog=prog, wait_s=args.wait)
    except NodeError as error:
        raise UsageError(str(error)) from None


_NODE_HELP = """\
Start, watch and restart this machine's share of a run on several machines, as `asyncrl
run` does for one: the same restart and crash-loop rules, workers' keys derived from the
run secret in run.dir (which every machine shares), this machine's GPUs handed out one
per GPU worker. Workers of dataloader, generate, reward and harness are named
ROLE-NODE-I (I from --first-index on); train, critic, logp and ref_logp are each one
group of pipeline.workers[role] ranks, named ROLE-RANK, run whole by one machine or split
by rank over several (ROLE@R-S on each: they meet where their rank 0 announces in
run.dir). Exits when the run is over."""


def add_node_parser(commands: argparse._SubParsersAction) -> None:
    node = commands.add_parser(
        "node", help="run this machine's share of a run on several machines",
        description=_NODE_HELP,
    )  # fmt: skip
    add_config_arguments(node)
    node.add_argument(
        "--roles", metavar="ROLE[=N],...",
        help="this machine's workers, e.g. generate=2,logp,train@1: N of each (a role alone: "
        "its pipeline.workers count; a grouped role takes no other, or @R-S for its ranks R "
        "to S); `scheduler` among them is --with-scheduler",
    )  # fmt: skip
    node.add_argument(
        "--with-scheduler", action="store_true",
        help="this machine runs the scheduler too, restarted from its journal if it dies",
    )  # fmt: skip
    node.add_argument(
        "--resume", action="store_true", help="continue the run in run.dir (the scheduler's)"
    )
    node.add_argument(
        "--scheduler", metavar="tcp://HOST:PORT",
        help="where the workers dial the scheduler (events on PORT+1); default: the "
        "endpoints it announces in run.dir",
    )  # fmt: skip
    node.add_argument("--node", help="this machine's name in its workers' names (default: "
                      "its host name); unique among the run's machines")  # fmt: skip
    node.add_argument(
        "--first-index", type=int, default=0, metavar="I",
        help="the first number of this machine's workers of a role (default 0); the "
        "generator numbered 0 validates, so give each machine its own range",
    )  # fmt: skip
    node.add_argument("--gpus", metavar="0,1,...",
                      help="the GPUs to hand out (default: CUDA_VISIBLE_DEVICES, else all "
                      "nvidia-smi lists)")  # fmt: skip
    node.add_argument(
        "--wait", type=float, default=300.0, metavar="S",
        help="how long to wait for the scheduler's machine to make the run secret (and keys)",
    )  # fmt: skip
    node.set_defaults(handler=_node)
