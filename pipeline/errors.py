"""The exceptions the store raises.

Every error the engine raises on purpose is a :class:`StoreError`, so a caller can catch one type.
Messages name the file, offset, option or value at fault, because an operator reading a log line
must be able to find the problem without a debugger.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error raised by rocketstore."""


class ConfigError(StoreError, ValueError):
    """A configuration value is unknown, malformed or out of range."""


class SparkVersionError(StoreError, RuntimeError):
    """The PySpark in use lacks an API a feature needs; the message names the feature, the
    version it needs and the one running (docs/spark-versions.md)."""


class NotAStoreError(StoreError):
    """A path that should be a broker store directory is not one (or is damaged beyond use)."""


class StoreLockedError(StoreError):
    """Another process (or another open in this process) holds the store's exclusive lock."""


class FencedError(StoreLockedError):
    """This writer lost the store to another: its lock was given away (a network partition on
    shared storage) or a newer writer recorded its epoch (rocketstore.pipeline.engine.fencing). Nothing of the
    refused call was written; the store object takes no more writes."""


class FileReplacedError(FencedError):
    """A file this writer had opened was replaced or removed under it: its name now leads to
    another file, or to none. A writer that took the store over gives the derived files new
    inodes (rocketstore.pipeline.engine.renewal), so this writer lost the store; nothing was written
    into the new file."""


class StoreClosedError(StoreError):
    """The store was used after :meth:`MessageStore.close`."""


class ReadOnlyStoreError(StoreError):
    """A write was attempted on a store opened read-only."""


class InvalidMessageError(StoreError, ValueError):
    """A message was refused before anything was written for it.

    ``index`` is the position of the offending message within its batch (0 for a single put).
    """

    def __init__(self, reason: str, index: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.index = index


class MessageTooLargeError(InvalidMessageError):
    """A body (or whole record) is larger than ``maxMessageSize``."""


class CorruptRecordError(StoreError):
    """A record failed its magic, length or CRC check.

    ``path`` is the segment file and ``offset`` the byte offset in the whole log (for a CommitLog,
    the physical offset; for a ConsumeQueue or IndexFile, the position inside that file).
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path} @ offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class DamagedLogError(CorruptRecordError):
    """Recovery found valid records after the end of the log it could read: damage inside the
    log, not a torn tail. Recovery refuses to cut (which would drop them) and changes nothing."""


class CorruptIndexError(CorruptRecordError):
    """A segment index object of the tier (``B/index/<base>``,
    :mod:`rocketstore.pipeline.format.segmentindex`) failed its checks: magic, version, CRC,
    lengths, order. ``path`` names the object and ``offset`` is the byte of the object at
    fault."""


class NotFoundError(StoreError, LookupError):
    """What was asked for (a topic, a queue, a record at an offset, a message by id) is not in
    the store. Nothing is wrong with the store."""


class OffsetOutOfRangeError(NotFoundError, IndexError):
    """A CommitLog offset or queue offset outside what the store holds."""


class SegmentGoneError(NotFoundError):
    """A file a read-only view listed when it opened (a CommitLog segment, ConsumeQueue file
    or IndexFile) was deleted before the view read it: on a live store, retention deletes the
    oldest files while readers work. Nothing is wrong with the store; open it again to see
    where it begins now."""


class NotVisibleError(OffsetOutOfRangeError):
    """An offset the writer published (or a unit, index entry or msgId names) lies in a file
    that this host's listing of its directory still does not show after ``visibilityWaitMs``
    of listing it again: written on another host, not visible here yet (rocketstore.pipeline.files.visibility).
    Not damage: nothing is wrong with the store, this host sees less of it for now."""


class DiskFullError(StoreError):
    """A put was refused because the disk holding the store is nearly full (above RocketMQ's
    ``diskSpaceWarningLevelRatio``, 90 %). Nothing of the refused put was written, and nothing
    stored before is lost; puts are accepted again once retention has freed space.
    """

    def __init__(
        self, store: str, used_ratio: float, threshold: float, tier_backlog: str | None = None
    ) -> None:
        super().__init__(
            f"{store}: disk is {used_ratio:.1%} full, above the {threshold:.0%} at which puts "
            "are refused (diskSpaceWarningLevelRatio); free space or let retention delete old "
            "CommitLog files" + (f"; {tier_backlog}" if tier_backlog else "")
        )
        self.tier_backlog = tier_backlog
        self.store = store
        self.used_ratio = used_ratio
        self.threshold = threshold


class StoreFailedError(StoreError):
    """A write failed part-way (an I/O error, a full disk, an injected fault), so the store
    stopped taking writes: what the failed put wrote may be incomplete, and only recovery can
    tell which of its messages landed. Close the store and open it again; recovery on that open
    completes or drops the failed put's messages exactly, as after a crash. Reads still work.
    """


class ProgressNotRecordedError(StoreError):
    """A flush wrote and synced the store's files but could not record how far (the progress
    file or the checkpoint could not be written: a full disk, an I/O error). Nothing is lost and
    the store goes on taking puts; both files keep naming the previous point, so notes set since
    then are not durable yet, and recovery after a crash starts from that point. The next flush
    tries again."""


class SegmentCreateError(StoreError):
    """A file the put needs (a CommitLog segment) could not be created: no space, no file
    descriptor left, no permission. Nothing of the put was written; the store is unchanged and
    takes the next put."""


class RenewalError(StoreError):
    """A writable open that took the store over uncleanly on shared storage could not give a
    derived file a new inode (rocketstore.pipeline.engine.renewal): no space, an I/O error, the file
    system cut off. The open fails; every file is as it was, and the next open tries again."""


class NativeError(StoreError):
    """The native core failed inside (a Rust panic): a bug in rocketstore, or a buffer the
    caller lent it changed while it was in use. What the call was writing may be incomplete,
    as after any failed write: the store fail-stops as usual."""


class TierError(StoreError):
    """Tiered storage (the S3 bucket of sealed segments, docs/tiering.md) failed. Every
    message names the bucket and the key (or prefix) at fault; ``bucket`` and ``key`` hold
    them. Nothing local is deleted because of it: local retention waits for uploads."""

    def __init__(self, message: str, bucket: str = "", key: str = "") -> None:
        super().__init__(message)
        self.bucket = bucket
        self.key = key


class TierConfigError(TierError, ConfigError):
    """The bucket cannot be used as configured: wrong or missing credentials, an endpoint that
    does not answer, a bucket that does not exist. ``setting`` names what to fix (a setting, or
    the AWS variable it can come from)."""

    def __init__(self, message: str, bucket: str, setting: str) -> None:
        super().__init__(message, bucket)
        self.setting = setting


class TierUnavailableError(TierError):
    """The object store did not answer (refused, timed out, a server error) after the client's
    retries. Transient: the upload is tried again later; nothing local was deleted."""


class PreconditionFailedError(TierError):
    """A conditional write lost (HTTP 412): ``If-None-Match: *`` on a key that exists, or
    ``If-Match`` with an ETag that is no longer the object's. Read again and decide again."""


class ObjectNotFoundError(TierError, NotFoundError):
    """A key the tier needs is not in the bucket (deleted there, or never written)."""


class ObjectMismatchError(TierError):
    """An object is not what was written or what its manifest says: another size, ETag or
    checksum, or a range shorter than asked for. The message names the object and offset."""


class ManifestError(TierError):
    """A manifest that cannot be used: not valid JSON, a field missing or out of range,
    segments not contiguous, or (:class:`ManifestOwnerError`) another store's."""


class ManifestOwnerError(ManifestError):
    """The prefix's manifest belongs to another store (its ``storeId`` is not this one's): two
    stores never share a prefix. Give one of them another ``brokerName`` or
    ``objectStorePrefix``."""


class ConsumerOffsetsError(StoreError, ValueError):
    """A ``consumerOffset.json`` (or its ``.bak``) that is not RocketMQ's format. The message
    names the file and where in it."""


class TopicConfigError(StoreError, ValueError):
    """A ``topics.json`` (or its ``.bak``) that is not RocketMQ's format: not JSON, or a field
    of the wrong type. The message names the file and where in it; nothing was written."""


class ConsoleDependencyError(StoreError):
    """A package of the ``console`` extra is not installed."""


class BadRequestError(StoreError, ValueError):
    """A request parameter is missing, malformed or out of range (HTTP 400)."""


class SinkReplayError(StoreError):
    """A re-run of a micro-batch brought different rows than the attempt that already landed."""


class SinkFailpoint(StoreError):
    """Raised by the test suite's fault injection to simulate a task
    dying mid-append (rocketstore.sink.append.FAILPOINT_ENV)."""


class QueryIdentityError(StoreError):
    """The sink could not tell which streaming query it is writing for."""


class DataLossError(StoreError):
    """Messages a query had not read yet are gone (retention deleted their files).

    Raised only with ``failOnDataLoss=true`` (the default); the message names every queue
    affected, the offsets lost and how many messages that is.
    """
