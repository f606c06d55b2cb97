"""The source tree keeps the shape a newcomer can walk.

- No circle of imports among the source modules, at any depth: imports inside functions
  and under ``if TYPE_CHECKING:`` count too (a circle of types is still a circle).
- The folders are layers, each importing only from those it builds on (``LAYERS``):
  transport at the bottom; runtime/contract (what the scheduler, the workers and the
  launchers share) on it; the scheduler (runtime/scheduler) and the workers (actors) each
  on the contract and never on each other, nor on launching; launching (runtime/launch:
  local, node, clusters, the CLI, the report) on the scheduler and the contract.
- actors/worker (the loop every role runs) is role-agnostic: of actors/ it imports only
  the actor contract and itself (``WORKER_MAY_IMPORT``), never a model, an engine, a
  task, serving or training code; what a role needs at its start is in actors/startup.

A module's length is no test: a module is split by concern, in review, never to fit a
number (a bound of 450 lines had modules split into mixins that re-declared their host's
state).
- actors/ has no private module at its top: its machinery lives in folders by subsystem,
  and the docs' architecture page names every one of them in its layout.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STACK = ("transport", "runtime", "actors")  # the source folders
# Each layer and the layers it may import from (itself included).
LAYERS: dict[str, frozenset[str]] = {
    "transport": frozenset({"transport"}),
    "runtime.contract": frozenset({"transport", "runtime.contract"}),
    "runtime.scheduler": frozenset({"transport", "runtime.contract", "runtime.scheduler"}),
    "actors": frozenset({"transport", "runtime.contract", "actors"}),
    "runtime.launch": frozenset(
        {"transport", "runtime.contract", "runtime.scheduler", "runtime.launch"}
    ),
}

# What actors/worker may import: the layers below actors, and of actors/ the hooks a role
# fills in (actor.py) and the worker's own modules. Prefixes of dotted names.
WORKER_MAY_IMPORT = (
    "asyncrl.transport",
    "asyncrl.runtime.contract",
    "asyncrl.actors.actor",
    "asyncrl.actors.worker",
)


def source_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every source module by its dotted name under ``asyncrl``."""
    found: dict[str, Path] = {}
    for folder in STACK:
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("asyncrl", *parts))] = path
    return found


def imported(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports, wherever the import stands.

    ``from X import y`` imports X.y when that is a module of its own, else X.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, node.module] if node.module else base)
            for alias in node.names:
                whole = f"{origin}.{alias.name}"
                found.add(whole if whole in known else origin)
    return {module for module in found if module in known and module != name}


def import_graph(known: Mapping[str, Path]) -> dict[str, set[str]]:
    return {name: imported(name, path, known) for name, path in known.items()}


def a_circle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One circle of the graph, its first node repeated at the end; None if there is none.

    A depth-first walk without recursion: meeting a node still on the path closes one.
    """
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = [start]
        ahead: list[Iterator[str]] = [iter(sorted(graph[start]))]
        while path:
            following = next(ahead[-1], None)
            if following is None:
                done.add(path.pop())
                ahead.pop()
            elif following in path:
                return [*path[path.index(following) :], following]
            elif following not in done:
                path.append(following)
                ahead.append(iter(sorted(graph[following])))
    return None


def layer_of(module: str) -> str:
    """``asyncrl.runtime.scheduler.core.state`` -> ``runtime.scheduler``; the bare
    ``asyncrl.runtime`` package counts as the contract."""
    parts = module.split(".")
    if parts[1] != "runtime":
        return parts[1]
    return "runtime." + (parts[2] if len(parts) > 2 else "contract")


def against_the_layers(graph: Mapping[str, set[str]]) -> list[str]:
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if layer_of(target) not in LAYERS[layer_of(name)]
    )


def off_the_worker_table(graph: Mapping[str, set[str]]) -> list[str]:
    """Imports by a module of actors/worker of anything ``WORKER_MAY_IMPORT`` leaves out."""

    def within(module: str, prefix: str) -> bool:
        return module == prefix or module.startswith(prefix + ".")

    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if within(name, "asyncrl.actors.worker")
        for target in targets
        if not any(within(target, allowed) for allowed in WORKER_MAY_IMPORT)
    )


def test_no_source_modules_import_each_other_in_a_circle() -> None:
    circle = a_circle(import_graph(source_modules()))
    assert circle is None, "import circle: " + " -> ".join(circle or ())


def test_every_module_is_in_a_layer() -> None:
    assert {layer_of(name) for name in source_modules()} == set(LAYERS)


def test_imports_go_down_the_layers() -> None:
    upward = against_the_layers(import_graph(source_modules()))
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def plant(root: Path, modules: Mapping[str, str]) -> dict[str, Path]:
    """A source tree under ``root`` made of ``modules`` (path: text), each folder a
    package; its modules by dotted name."""
    for path, text in modules.items():
        folder = root
        for part in Path(path).parent.parts:
            folder = folder / part
            folder.mkdir(exist_ok=True)
            (folder / "__init__.py").touch()
        (root / path).write_text(text)
    for top in STACK:
        (root / top).mkdir(exist_ok=True)
    return source_modules(root)


def test_a_worker_module_importing_the_scheduler_is_caught(tmp_path: Path) -> None:
    """The rule above, seen to fail: a planted worker module that imports the scheduler's
    core, another that imports launching."""
    known = plant(
        tmp_path,
        {
            "runtime/scheduler/core.py": "",
            "runtime/launch/local.py": "",
            "actors/role.py": "from asyncrl.runtime.scheduler.core import x\n"
            "def f():\n    import asyncrl.runtime.launch.local\n",
        },
    )
    assert against_the_layers(import_graph(known)) == [
        "asyncrl.actors.role -> asyncrl.runtime.launch.local",
        "asyncrl.actors.role -> asyncrl.runtime.scheduler.core",
    ]


def test_the_worker_imports_only_its_table() -> None:
    off = off_the_worker_table(import_graph(source_modules()))
    assert not off, "actors/worker imports role code:\n" + "\n".join(off)


def test_a_worker_module_importing_role_code_is_caught(tmp_path: Path) -> None:
    """The worker's table, seen to fail: a planted worker module that imports a model and,
    inside a function, an engine; its imports of the actor contract and the run's config
    pass."""
    known = plant(
        tmp_path,
        {
            "runtime/contract/config.py": "",
            "actors/actor.py": "",
            "actors/policy/model.py": "",
            "actors/engines/__init__.py": "",
            "actors/worker/setup.py": "from asyncrl.runtime.contract.config import RunConfig\n"
            "from ..actor import Actor\n"
            "from ..policy.model import CausalLM\n"
            "def f():\n    from ..engines import EngineModel\n",
        },
    )
    assert off_the_worker_table(import_graph(known)) == [
        "asyncrl.actors.worker.setup -> asyncrl.actors.engines",
        "asyncrl.actors.worker.setup -> asyncrl.actors.policy.model",
    ]


def test_actors_has_no_private_module_at_its_top() -> None:
    private = sorted(p.name for p in (ROOT / "actors").glob("_*.py") if p.name != "__init__.py")
    assert not private, f"private modules at the top of actors/: {private}"


def test_the_architecture_page_names_every_folder_of_actors() -> None:
    page = (ROOT / "docs" / "pages" / "architecture.md").read_text()
    layout = page.split("## Layout", 1)[1].split("\n## ", 1)[0]
    folders = sorted(p.parent.name for p in (ROOT / "actors").glob("*/__init__.py"))
    named = set(re.findall(r"^\s+([a-z_]+)/ ", layout, re.MULTILINE))
    assert folders and not set(folders) - named, (
        f"not in the architecture page's layout: {set(folders) - named}"
    )


def test_the_check_sees_a_circle_of_types_through_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "actors"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "contract.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .group import Place\n"
    )
    (package / "group.py").write_text("def f():\n    from . import contract\n")
    for folder in ("transport", "runtime"):
        (tmp_path / folder).mkdir()
    graph = import_graph(source_modules(tmp_path))
    assert graph["asyncrl.actors.contract"] == {"asyncrl.actors.group"}
    assert graph["asyncrl.actors.group"] == {"asyncrl.actors.contract"}
    assert a_circle(graph) == [
        "asyncrl.actors.contract",
        "asyncrl.actors.group",
        "asyncrl.actors.contract",
    ]
    assert a_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
