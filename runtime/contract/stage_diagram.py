"""The stage table drawn as a Mermaid flowchart, so the pictures of it cannot drift.

The README and the docs' concepts page carry the output of :func:`mermaid_flowchart` for
the default table (a test compares them), and GitHub and the docs site both draw Mermaid.

A group state is a node; a stage is an edge labelled with its role (and its gate when it
has one). An exclusive stage is two edges through its working state, drawn as a rounded
node: a group is there only while leased. Branch stages are parallel edges from their
common source into their common target, which is where they join. Final states are drawn
with a double border. A stage that ``filters`` has a dotted edge from its source into
``filtered``: where a group whose rewards carry no signal leaves.

Regenerate the README's block with ``python -m asyncrl.runtime.contract.stage_diagram``.
"""

from __future__ import annotations

from .stages import DEFAULT_PIPELINE, FINAL_STATES, Gate, GroupState, Pipeline

__all__ = ["mermaid_flowchart"]


def mermaid_flowchart(pipeline: Pipeline) -> str:
    """A ``flowchart LR`` of ``pipeline``'s states and stages, as Mermaid source text.

    Pure and deterministic: nodes in the order the table first names them, one line per
    node and per edge, no trailing newline.
    """
    working = {stage.working for stage in pipeline.stages if stage.working is not None}
    lines = ["flowchart LR"]
    lines += [f"    {_node(state, working)}" for state in _states_in_order(pipeline)]
    for stage in pipeline.stages:
        label = str(stage.role) if stage.gate is Gate.FREE else f"{stage.role}: {stage.gate}"
        if stage.filters:
            lines.append(
                f'    {stage.source} -.->|"{stage.role}: no signal"| {GroupState.FILTERED}'
            )
        if stage.working is None:
            lines.append(f'    {stage.source} -->|"{label}"| {stage.target}')
            continue
        lines.append(f'    {stage.source} -->|"{label}"| {stage.working}')
        lines.append(f"    {stage.working} --> {stage.target}")
    return "\n".join(lines)


def _states_in_order(pipeline: Pipeline) -> list[GroupState]:
    seen = {pipeline.entry: None}
    for stage in pipeline.stages:
        for state in (stage.source, stage.working, stage.target):
            if state is not None:
                seen.setdefault(state, None)
    if any(stage.filters for stage in pipeline.stages):
        seen.setdefault(GroupState.FILTERED, None)
    return list(seen)


def _node(state: GroupState, working: set[GroupState]) -> str:
    if state in working:
        return f"{state}([{state}])"  # rounded: held only while a lease runs
    if state in FINAL_STATES:
        return f"{state}[[{state}]]"
    return f"{state}[{state}]"


if __name__ == "__main__":
    print(f"```mermaid\n{mermaid_flowchart(DEFAULT_PIPELINE)}\n```")
