"""The optional packages an extra brings (``pip install 'rocketstore[console]'``), checked
before a command that needs them imports any, so that a missing one is one clear line rather
than an ImportError from deep inside. Imports nothing of rocketstore but its errors: any layer
may ask."""

from __future__ import annotations

import importlib.util

from rocketstore.pipeline.errors import ConsoleDependencyError


def check_dependencies(needed: tuple[str, ...], extra: str) -> None:
    """Raise :class:`ConsoleDependencyError` saying ``extra`` and which of ``needed`` (module
    names) cannot be imported."""
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ConsoleDependencyError(f"{extra} (missing: {', '.join(missing)})")
