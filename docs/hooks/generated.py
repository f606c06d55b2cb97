"""Reference pages generated from the code at build time, so they cannot drift from it.

A page asks for a generated part by holding a marker on a line of its own:

- ``<!-- generated: config-reference -->``: every key of the run configuration, by
  section, with its default and what it allows (from the config schema's field metadata,
  the same words ``asyncrl config keys`` prints);
- ``<!-- generated: config-api -->``: the schema module's API, through mkdocstrings;
- ``<!-- generated: cli-reference -->``: the help of every command and subcommand of
  ``asyncrl``, ``asyncrl-scheduler`` and ``asyncrl-worker`` (from their argparse parsers).

The config schema and the command parsers are named here and nowhere else in the docs.

The API pages are read from the source by mkdocstrings, which finds modules by folder:
asyncrl's three folders install under one name (``asyncrl.runtime`` is ``runtime/``), so
before a build this hook lays them out as ``asyncrl/`` under ``build/packages`` (links to
wherever the installed package lives), the folder mkdocs.yml gives mkdocstrings. The
pictures of deploy/pictures/ are served as ``pictures/`` (one copy, shared with README.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Callable, Iterator
from importlib import import_module
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

# Where the code lives: the one place to change when a module moves.
CONFIG_SCHEMA = "asyncrl.runtime.contract.config.schema"
CLI_PARSERS = (
    ("asyncrl", "asyncrl.runtime.launch.cli.main:build_parser"),
    ("asyncrl-scheduler", "asyncrl.runtime.scheduler.cli:build_parser"),
    ("asyncrl-worker", "asyncrl.actors.cli:build_parser"),
    ("asyncrl-worker roles", "asyncrl.actors.cli:build_roles_parser"),
    ("asyncrl-worker check", "asyncrl.actors.cli:build_check_parser"),
    ("asyncrl eval", "asyncrl.actors.evaluation.command:build_eval_parser"),
)

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGE_TREE = REPOSITORY / "docs" / "build" / "packages"
PICTURES = REPOSITORY / "deploy" / "pictures"
SOURCE_FOLDERS = ("runtime", "actors", "transport")

HELP_WIDTH = "100"  # argparse wraps help to $COLUMNS; fixed so that a build is reproducible


@event_priority(100)  # before mkdocstrings reads its paths, which must exist by then
def on_config(config: Any) -> Any:
    root = PACKAGE_TREE / "asyncrl"
    root.mkdir(parents=True, exist_ok=True)
    for folder in SOURCE_FOLDERS:
        target = Path(import_module(f"asyncrl.{folder}").__path__[0]).resolve()
        link = root / folder
        if link.is_symlink() and link.resolve() == target:
            continue
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target, target_is_directory=True)
    return config


def on_files(files: Files, config: Any) -> Files:
    for picture in sorted(PICTURES.glob("*.png")):
        uri = f"{PICTURES.name}/{picture.name}"
        files.append(
            File(uri, str(PICTURES.parent), config["site_dir"], config["use_directory_urls"])
        )
    return files


def on_page_markdown(markdown: str, **_: Any) -> str:
    for marker, render in GENERATORS.items():
        line = f"<!-- generated: {marker} -->"
        if line in markdown:
            markdown = markdown.replace(line, render())
    return markdown


# ------------------------------------------------------------------------------ config


def config_reference() -> str:
    schema = import_module(CONFIG_SCHEMA)
    describe_fields = import_module(CONFIG_SCHEMA.rpartition(".")[0]).describe_fields
    root = schema.RunConfig
    hints = typing.get_type_hints(root)
    parts = []
    for section in dataclasses.fields(root):
        parts.append(f"## `{section.name}`\n\n{section.metadata.get('help', '')}.\n")
        parts.append("| key | default | meaning (allowed values) |\n|---|---|---|")
        for key, default, text in describe_fields(hints[section.name]):
            parts.append(f"| `{section.name}.{key}` | `{default}` | {_cell(text)} |")
        parts.append("")
    return "\n".join(parts)


def config_api() -> str:
    # mkdocstrings reads the directive after this hook, so the module is named once, here.
    return f"::: {CONFIG_SCHEMA}\n    options:\n      members: [RunConfig]\n"


def _cell(text: str) -> str:
    # A table cell is one line; a pipe would end it, and angle brackets would read as HTML.
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


# --------------------------------------------------------------------------------- CLI


def cli_reference() -> str:
    os.environ["COLUMNS"] = HELP_WIDTH
    parts = []
    for name, where in CLI_PARSERS:
        parser = _load(where)()
        parser.prog = name
        parts.extend(_command_help(name, parser, level=2))
    return "\n".join(parts)


def _load(where: str) -> Callable[[], argparse.ArgumentParser]:
    module, _, attr = where.partition(":")
    return getattr(import_module(module), attr)


def _command_help(name: str, parser: argparse.ArgumentParser, level: int) -> Iterator[str]:
    yield f"{'#' * level} `{name}`\n"
    yield f"```text\n{parser.format_help().rstrip()}\n```\n"
    for sub_name, sub in _subcommands(parser):
        yield from _command_help(f"{name} {sub_name}", sub, min(level + 1, 4))


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:  # argparse keeps subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub_name, sub in action.choices.items():
                if id(sub) not in seen:  # an alias names the same parser again
                    seen.add(id(sub))
                    yield sub_name, sub


GENERATORS: dict[str, Callable[[], str]] = {
    "config-reference": config_reference,
    "config-api": config_api,
    "cli-reference": cli_reference,
}
