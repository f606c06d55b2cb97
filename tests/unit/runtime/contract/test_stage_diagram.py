"""The pictures of the stage table are the table's own output, so they cannot go stale.

The README's Mermaid block and the docs' pipeline page are compared with what
``mermaid_flowchart`` draws from the table today; when a stage changes, rerun
``python -m asyncrl.runtime.contract.stage_diagram`` and paste its block.
"""

from __future__ import annotations

import re
from pathlib import Path

from asyncrl.runtime.contract.stage_diagram import mermaid_flowchart
from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE, Gate, GroupState, Pipeline, Stage

ROOT = Path(__file__).resolve().parents[4]
PIPELINE_PAGE = ROOT / "docs" / "pages" / "concepts" / "pipeline.md"


def mermaid_blocks(path: Path) -> list[str]:
    return re.findall(r"^```mermaid\n(.*?)\n```$", path.read_text(), re.DOTALL | re.MULTILINE)


def test_the_readme_draws_the_default_table() -> None:
    assert mermaid_blocks(ROOT / "README.md") == [mermaid_flowchart(DEFAULT_PIPELINE)], (
        "README.md's diagram is not the stage table's: paste the block that "
        "`python -m asyncrl.runtime.contract.stage_diagram` prints"
    )


def test_the_pipeline_page_draws_the_default_table_and_the_critics() -> None:
    expected = [
        mermaid_flowchart(DEFAULT_PIPELINE),
        mermaid_flowchart(DEFAULT_PIPELINE.with_critic()),
    ]
    assert mermaid_blocks(PIPELINE_PAGE) == expected


def test_branches_join_in_their_common_target_and_exclusive_stages_pass_their_working_state():
    text = mermaid_flowchart(DEFAULT_PIPELINE)
    branch_edges = [line.strip() for line in text.splitlines() if line.endswith("| ready")]
    assert branch_edges == [
        'generated -->|"logp"| ready',
        'generated -->|"ref_logp"| ready',
        'generated -->|"reward"| ready',
    ]
    assert 'pending -->|"generate: admit"| generating' in text
    assert "generating --> generated" in text
    assert "generating([generating])" in text  # a working state is drawn rounded
    assert "trained[[trained]]" in text  # a final state, double-bordered


def test_a_new_row_is_a_new_edge() -> None:
    s = GroupState
    table = Pipeline(
        (
            Stage("sampler", s.PENDING, s.GENERATED, s.GENERATING, Gate.ADMIT),
            Stage("judge", s.GENERATED, s.READY),
            Stage("train", s.READY, s.TRAINED, s.TRAINING, Gate.STEP),
        )
    )
    text = mermaid_flowchart(table)
    assert text.splitlines()[0] == "flowchart LR"
    assert 'generated -->|"judge"| ready' in text
    assert 'pending -->|"sampler: admit"| generating' in text
    assert not text.endswith("\n")
