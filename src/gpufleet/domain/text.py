"""The one rule for text the controller accepts and stores, on every field of every body (both databases).

PostgreSQL cannot store a NUL character in text, and no database driver can encode a lone UTF-16
surrogate (``"\\ud800"`` is valid JSON, but not a character) as UTF-8: such text is refused at the edge
with a 422 naming the field, instead of failing the write it would have joined. Lengths are bounded
by the column each field lands in (``controller/store/models.py``).
"""

from __future__ import annotations

import re

from gpufleet.domain.errors import InvalidInput

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
TEXT_EXPECTED = "text without NUL characters or lone surrogates (no database can store them)"

NAME_MAX = 128  # node ids, racks, job ids, actor names: String(128) columns
REF_MAX = 200  # event ids, components, links, audit targets: String(200) columns


def unstorable(value: str) -> bool:
    """True when ``value`` holds a character no database can store (NUL, a lone surrogate)."""
    return _UNSTORABLE.search(value) is not None


def check_text(field: str, value: str, max_length: int) -> str:
    """``value`` if it can be stored in a column of ``max_length`` characters, else InvalidInput."""
    if unstorable(value):
        raise InvalidInput(field, value, TEXT_EXPECTED)
    if len(value) > max_length:
        raise InvalidInput(field, value, f"at most {max_length} characters")
    return value
