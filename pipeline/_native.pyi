"""Type stubs of the native core (the Rust crate in native/); see pipeline/format/native.py."""

from collections.abc import Callable
from typing import Any

DECODE_BODY: int
MAGIC: int
BLANK_MAGIC: int
BLANK_SIZE: int
FIXED_SIZE_V4: int
BORNHOST_V6_FLAG: int
STOREHOSTADDRESS_V6_FLAG: int
TRANSACTION_MASK: int
TRANSACTION_COMMIT_TYPE: int
TRANSACTION_ROLLBACK_TYPE: int
OFF_TOTALSIZE: int
OFF_MAGIC: int
OFF_BODYCRC: int
OFF_QUEUEID: int
OFF_FLAG: int
OFF_QUEUEOFFSET: int
OFF_PHYSICALOFFSET: int
OFF_SYSFLAG: int
OFF_BORNTIMESTAMP: int
OFF_BORNHOST: int
UNIT_SIZE: int
INDEX_HEADER_SIZE: int
INDEX_SLOT_SIZE: int
INDEX_ENTRY_SIZE: int
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
def decode_one(buf: Any, rel: int, base: int, limit: int, check_crc: bool) -> tuple[Any, Any]: ...
def record_starts(buf: Any, rel: Any, base: int, limit: int) -> Owned: ...

class EncodeBatch:
    def __init__(
        self,
        *,
        n: int,
        topics: Any,
        topic_codes: Any,
        queue_ids: Any,
        flags: Any,
        sys_flags: Any,
        reconsume: Any,
        prep_tx: Any,
        born_ts: Any,
        born_missing: Any,
        born_hosts: Any,
        born_codes: Any,
        store_host: bytes,
        bodies: Any,
        keys: Any,
        tags: Any,
        uniq: Any,
        user_props: Any,
    ) -> None: ...
    def measure(self, sizes: Any, max_props: int) -> tuple[int, int]: ...
    def tags_codes(self, out: Any) -> None: ...
    def encode(
        self,
        dest: Any,
        dest_pos: int,
        lo: int,
        hi: int,
        phys: Any,
        queue_offsets: Any,
        sizes: Any,
        store_ts: int,
    ) -> None: ...
    def __len__(self) -> int: ...

def body_crcs(bodies: Any, out: Any) -> None: ...
def java_hashes(strings: Any, out: Any) -> None: ...
def index_keys(
    topics: Any, topic_codes: Any, uniq: Any, keys: Any, sys_flags: Any
) -> tuple[Owned, Owned]: ...
def uniq_ids(prefix: bytes, start: int, out: Any) -> None: ...
def index_put(
    slots: Any,
    entries: Any,
    index_count: int,
    begin_ts: int,
    hashes: Any,
    phys: Any,
    times: Any,
) -> int: ...
def index_mend(
    slots: Any, entries: Any, count: int, phys_limit: int
) -> tuple[int, int, int, int | None]: ...
def walk(
    buf: Any, start: int, limit: int, base: int, check_crc: bool, max_records: int = ...
) -> dict[str, Any]: ...
def dispatch_walk(
    buf: Any,
    start: int,
    limit: int,
    base: int,
    end_phys: int,
    check_crc: bool,
    index: bool,
) -> dict[str, Any]: ...

class SinglePut:
    def __init__(
        self,
        store_host: bytes,
        max_body: int,
        segment_size: int,
        slot_num: int,
        index_num: int,
    ) -> None: ...
    def put(
        self,
        msg: Any,
        uniq: Any,
        now: int,
        log: Any,
        log_pos: int,
        phys: int,
        units: Any,
        unit_pos: int,
        queue_offset: int,
        index: Any | None,
        index_count: int,
        begin_ts: int,
        begin_phy: int,
        slot_count: int,
        hook: Callable[[str, int], None] | None,
    ) -> tuple[int, int, int] | None: ...

def _panic_under_guard() -> None: ...
