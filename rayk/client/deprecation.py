"""The one way rayk's client marks an old spelling: a DeprecationWarning that names the new
one, pointing at the caller's line. The old spelling keeps working."""

from __future__ import annotations

import warnings


def deprecated(old: str, new: str) -> None:
    """Warns, from a public method, that its caller used `old`; `new` replaces it."""
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)
