"""Data for the browser as JavaScript text: JSON that no stored text can break out of.

An exported page reads its data from script files beside it (``<script src>``: browsers refuse ``fetch`` from
``file://``), so model output ends up inside JavaScript source. :func:`js_value` writes JSON with every non-ASCII
character escaped (so U+2028 and U+2029, line terminators in older JavaScript, become ``\\u2028``) and ``<``, ``>``,
``&`` as ``\\u003c``, ``\\u003e``, ``\\u0026`` (so ``</script>`` and ``<!--`` cannot appear in the text even when it is
pasted inline).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["js_assign", "js_value"]


def js_value(value: Any) -> str:
    """``value`` as a JavaScript expression (JSON, escaped as the module docstring says)."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def js_assign(target: str, value: Any) -> str:
    """A script line ``<target> = <value>;`` (``target`` is code of ours, e.g. ``window.VIEWER_MANIFEST``)."""
    return f"{target} = {js_value(value)};\n"
