"""The record layer: how a message is laid out in bytes, and nothing about files.

The CommitLog record, the ConsumeQueue unit and the IndexFile's geometry (``layout``), the
codecs that write and read them (``record``, ``encode``, ``native``: the Rust core's Python
face), Java's string hash (``javahash``), the ``Message`` type, tag filters (``subscription``)
and body formats (``bodyformat``).

May import: ``rocketstore.pipeline``'s own modules (errors, config) and the native extension.
Imported by every layer above: ``files``, ``engine``, ``tools``, ``console``, the sink and the
source. A layers contract in ``pyproject.toml`` (``make lint``) enforces it.
"""
