"""How validation samples (``data.val_sampling``; the fields' metadata: fields.py).

Apart from training's sampling (``algorithm.temperature``, ``top_p``, ``top_k``,
``min_p``), so a run can train at temperature 1 and validate greedily, or sample k
responses per prompt for pass@k at a temperature of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .fields import doc

__all__ = ["ValSamplingSection"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ValSamplingSection:
    temperature: float = field(
        default=0.0,
        metadata=doc(
            "validation's sampling temperature; 0 = greedy (the most likely token)", min=0
        ),
    )
    top_p: float = field(
        default=1.0,
        metadata=doc(
            "validation's nucleus sampling (as algorithm.top_p); 1: the whole distribution",
            exclusive_min=0,
            max=1,
        ),
    )
    top_k: int = field(
        default=0, metadata=doc("validation's top-k (as algorithm.top_k); 0: every token", min=0)
    )
    min_p: float = field(
        default=0.0,
        metadata=doc(
            "validation's min-p (as algorithm.min_p): tokens less likely than this times "
            "the most likely one are left out; 0: none",
            min=0,
        ),
    )

    def __post_init__(self) -> None:
        # At 1 only the most likely token would be left: greedy, said another way.
        if not self.min_p < 1:
            raise ValueError(f"min_p: got {self.min_p!r}; allowed: a number in [0, 1)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
