"""Text shown on a terminal: model and harness output with its control characters escaped.

Kept apart from the models (no pydantic here): every command line view prints through it,
and a view that builds no model must not build the tree's to print a line.
"""

from __future__ import annotations

from typing import Final

__all__ = ["escape_controls"]

# Shown text comes from models and harnesses: printed raw, an escape sequence in it would
# drive the operator's terminal, a newline would forge table rows, a bidi override would
# reorder what is shown. Escape C0/C1 controls, DEL and the bidi controls.
_ESCAPES: Final = {
    **{code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)]},
    **{code: f"\\u{code:04x}" for code in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]},
    0x09: "\\t",
    0x0A: "\\n",
    0x0D: "\\r",
}


def escape_controls(text: str) -> str:
    """``text`` with every control character shown as an escape, on one line."""
    return text.translate(_ESCAPES)
