"""``asyncrl``: the user's entry point.

asyncrl run -c run.yaml [--resume]        # scheduler + every worker on this machine
asyncrl config check -c run.yaml pipeline.max_staleness=0
asyncrl config show -c run.yaml          # the resolved config, as YAML
asyncrl config keys                      # every key with its default and meaning
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from asyncrl.runtime.config import describe_fields, dump_config

from .common import add_config_arguments, config_from_args, run_command

__all__ = ["main"]


def _check(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    source = args.config or "defaults"
    print(f"ok: {source} is a valid configuration (run {cfg.run.name!r} in {cfg.run.dir})")
    return 0


def _show(args: argparse.Namespace) -> int:
    print(dump_config(config_from_args(args)), end="")
    return 0


def _run(args: argparse.Namespace) -> int:
    from asyncrl.runtime.launch.local import run_locally

    cfg = config_from_args(args)
    config_args = [*(["-c", str(args.config.resolve())] if args.config else []), *args.overrides]
    return run_locally(cfg, config_args, resume=args.resume)


def _keys(_args: argparse.Namespace) -> int:
    rows = describe_fields()
    width = max(len(key) for key, _, _ in rows)
    for key, default, text in rows:
        print(f"{key:<{width}}  {default:<24}  {text}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrl", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(title="commands")
    run = commands.add_parser("run", help="run the whole pipeline on this machine")
    add_config_arguments(run)
    run.add_argument("--resume", action="store_true", help="continue the run in run.dir")
    run.set_defaults(handler=_run)
    config = commands.add_parser("config", help="validate and show run configurations")
    actions = config.add_subparsers(title="actions")
    for name, handler, text in (
        ("check", _check, "validate a config (and overrides); one line per problem"),
        ("show", _show, "print the resolved config as YAML"),
    ):
        sub = actions.add_parser(name, help=text)
        add_config_arguments(sub)
        sub.set_defaults(handler=handler)
    actions.add_parser("keys", help="list every key with its default").set_defaults(handler=_keys)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("asyncrl", build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
