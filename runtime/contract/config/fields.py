"""Field metadata for the config's sections: what each of its keys means.

Each constraint is declared once, in the field's metadata, and the generic loader
(`load.py`) enforces it and words the error from it:

- "help": one line shown by `describe_fields` and the CLI;
- "min" / "max": inclusive bounds; "exclusive_min": a strict lower bound;
- "keys": the only keys a mapping field may have;
- "one_or_list": a list field that also takes one value, as a list of one;
- "one_line": a string field refused if it holds a line break or another control
  character (a value written into a script or a path, where one would start a new line).

For mapping and list fields the bounds apply to each value. A check across fields goes in
the section's `__post_init__` as `ValueError("<field>: got ...; allowed: ...")`; the loader
prefixes the section's dotted path.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["CONTROL_CHARACTERS", "doc"]

# C0 and C1 controls (newline, carriage return, NUL, escape...) and Unicode's line and
# paragraph separators: what may start a new line where a value is written out.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def doc(text: str, **limits: Any) -> dict[str, Any]:
    """Field metadata: one-line help plus limits (see this module's docstring)."""
    return {"help": text, **limits}
