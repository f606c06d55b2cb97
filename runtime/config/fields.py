"""Field metadata for the config's sections: what each of its keys means.

Each constraint is declared once, in the field's metadata, and the generic loader
(`load.py`) enforces it and words the error from it:

- "help": one line shown by `describe_fields` and the CLI;
- "min" / "max": inclusive bounds; "exclusive_min": a strict lower bound;
- "keys": the only keys a mapping field may have;
- "one_or_list": a list field that also takes one value, as a list of one.

For mapping and list fields the bounds apply to each value. A check across fields goes in
the section's `__post_init__` as `ValueError("<field>: got ...; allowed: ...")`; the loader
prefixes the section's dotted path.
"""

from __future__ import annotations

from typing import Any

__all__ = ["doc"]


def doc(text: str, **limits: Any) -> dict[str, Any]:
    """Field metadata: one-line help plus limits (see this module's docstring)."""
    return {"help": text, **limits}
