"""What every console script shares: argument helpers and the one-line error exit."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from asyncrl.runtime.contract.config import ConfigError, RunConfig, load_config
from asyncrl.runtime.contract.rundir import private_files

__all__ = [
    "UsageError",
    "add_config_arguments",
    "config_from_args",
    "require_extras",
    "run_command",
]


class UsageError(Exception):
    """A mistake of the user's that one line can explain; no traceback is shown."""


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c", "--config", type=Path, help="run configuration (YAML); omit for the defaults"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="override a config value"
    )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return load_config(args.config, args.overrides)


def require_extras(cfg: RunConfig) -> None:
    """A UsageError naming what to install if ``cfg`` needs a package that is missing."""
    from asyncrl.runtime.contract.extras import missing_extras

    missing = missing_extras(cfg)
    if missing:
        raise UsageError("; ".join(missing))


def run_command(
    prog: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    *,
    intermixed: bool = False,
) -> int:
    """Parse, dispatch to ``args.handler``, and turn expected failures into one line.
    ``intermixed``: overrides may come before and after options (a parser without
    sub-commands)."""
    args = parser.parse_intermixed_args(argv) if intermixed else parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        with private_files():  # prompts and outputs land in the run directory's files
            return handler(args)
    except (ConfigError, UsageError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
