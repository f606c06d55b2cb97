"""The install layout: every source package is listed, so a wheel carries all of it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for name, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    assert found == listed, f"unlisted: {sorted(found - listed)}; stale: {sorted(listed - found)}"


def test_the_first_commands_install_draws_the_report() -> None:
    """The README's first command installs the base package only; `asyncrl report` after it
    must draw, so its plotting library is a base dependency, not an extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {dep.split(">")[0].split("=")[0].split("[")[0] for dep in project["dependencies"]}
    assert "matplotlib" in base
