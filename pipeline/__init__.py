"""rocketstore's store engine and its tools, in layers (docs/development.md has the table).

From the bottom: this package's own modules (``errors``, ``config``, ``layout``,
``wholenumbers``), ``format`` (records and codecs), ``files`` (the store's files), ``engine``
(``MessageStore``), ``tools`` (``verify``, ``lag``, the metrics), ``console``, and ``cli``
(the ``rocketstore`` command). A module imports only from its own layer and those below it;
``make lint`` checks it (the import contracts in pyproject.toml).

The names most code needs are here: ``MessageStore``, ``StoreConfig``, ``Message`` and
``StoreError``. They are imported when first used, so that ``rocketstore --help`` loads none
of numpy, pyarrow or the store.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rocketstore.pipeline.config import StoreConfig
    from rocketstore.pipeline.engine.store import MessageStore
    from rocketstore.pipeline.errors import StoreError
    from rocketstore.pipeline.format.message import Message

__all__ = ["Message", "MessageStore", "StoreConfig", "StoreError"]

_WHERE = {
    "MessageStore": "rocketstore.pipeline.engine.store",
    "StoreConfig": "rocketstore.pipeline.config",
    "Message": "rocketstore.pipeline.format.message",
    "StoreError": "rocketstore.pipeline.errors",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rocketstore.pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
