"""``asyncrl-worker``: one stateless worker process per role. ``roles`` for now.

asyncrl-worker roles       # each role's stages: what it consumes and what it produces
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from asyncrl.runtime.core.pipeline import DEFAULT_PIPELINE, Role

from ._common import run_command

__all__ = ["main"]


def _roles(_args: argparse.Namespace) -> int:
    print(f"{Role.DATALOADER}: feeds new groups into {DEFAULT_PIPELINE.entry}")
    for stage in DEFAULT_PIPELINE.stages:
        print(stage)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrl-worker", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(title="commands")
    commands.add_parser("roles", help="list the roles and their stages").set_defaults(
        handler=_roles
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("asyncrl-worker", build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
