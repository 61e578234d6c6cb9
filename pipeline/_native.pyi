# Types of the native core (the crate in native/) as pipeline.native uses it. Names not
# listed here are typed Any.
from typing import Any

DECODE_BODY: int
DECODE_PROPERTIES: int
DECODE_KEYS: int
DECODE_TAGS: int
DECODE_UNIQ_KEY: int
DECODE_HOSTS: int
DECODE_MSG_ID: int

class Owned:
    """A read-only buffer owning one result vector of the crate."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

def decode(
    buf: Any,
    rel: Any,
    base: int,
    limit: int,
    sizes: Any | None,
    check_crc: bool,
    groups: int,
) -> dict[str, Any]: ...
def record_starts(buf: Any, rel: Any, base: int, limit: int) -> Owned: ...
def walk(
    buf: Any, start: int, limit: int, base: int, check_crc: bool, max_records: int = ...
) -> dict[str, Any]: ...
def __getattr__(name: str) -> Any: ...
