"""The metric families of a store root's ``/metrics`` (rocketstore.pipeline.tools.metrics): every
family's name, kind, help text and labels, in the order a scrape lists them, and the builder a
scrape fills. docs/monitoring.md describes them.

Names follow RocketMQ 5's metrics where one exists (``rocketmq_messages_in_total``,
``rocketmq_throughput_in_total``, ``rocketmq_consumer_lag_messages``,
``rocketmq_consumer_lag_latency``, in its units: messages, bytes, milliseconds), and are
``rocketstore_*`` otherwise.

:data:`FAMILIES` is constant; a :class:`Families` belongs to one scrape (not thread-safe).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# name -> (kind, help, labels). Counters are named without _total here: prometheus_client adds
# it to the samples.
FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "rocketstore_broker_up": (
        "gauge",
        "1 when the broker directory's files could be read at this scrape, else 0",
        ("broker",),
    ),
    "rocketstore_broker_info": (
        "gauge",
        "1 per broker; bounds says where its queue bounds came from (progress: the flush "
        "progress file; open: a read-only open, for a store the file does not describe)",
        ("broker", "bounds"),
    ),
    "rocketmq_messages_in": (
        "counter",
        "Messages ever stored in the topic on the broker (the sum of its queues' max offsets)",
        ("broker", "topic"),
    ),
    "rocketmq_throughput_in": (
        "counter",
        "Bytes ever written to the broker's CommitLog (its flushed end offset), all topics",
        ("broker",),
    ),
    "rocketstore_messages": (
        "gauge",
        "Messages the broker still holds of the topic (max - min offset, summed over queues)",
        ("broker", "topic"),
    ),
    "rocketstore_queues": (
        "gauge",
        "ConsumeQueues of the topic on the broker",
        ("broker", "topic"),
    ),
    "rocketstore_queue_min_offset": (
        "gauge",
        "A queue's min offset (first message retention has kept); per-queue series",
        ("broker", "topic", "queue_id"),
    ),
    "rocketstore_queue_max_offset": (
        "gauge",
        "A queue's max offset (one past its last message); per-queue series",
        ("broker", "topic", "queue_id"),
    ),
    "rocketstore_commitlog_min_offset_bytes": (
        "gauge",
        "CommitLog offset of the first byte the broker holds (retention moves it)",
        ("broker",),
    ),
    "rocketstore_commitlog_files": ("gauge", "CommitLog segment files", ("broker",)),
    "rocketstore_commitlog_size_bytes": (
        "gauge",
        "Bytes of the CommitLog segment files (their apparent sizes)",
        ("broker",),
    ),
    "rocketstore_commitlog_files_deleted": (
        "counter",
        "CommitLog segments retention has deleted (the first offset / the segment size)",
        ("broker",),
    ),
    "rocketstore_oldest_message_timestamp_seconds": (
        "gauge",
        "Store time of the first record the broker's CommitLog holds",
        ("broker",),
    ),
    "rocketstore_newest_message_timestamp_seconds": (
        "gauge",
        "Store time of the last record the last flush recorded",
        ("broker",),
    ),
    "rocketstore_last_flush_timestamp_seconds": (
        "gauge",
        "When a writer last recorded a flush (config/rocketstore.json's modification time)",
        ("broker",),
    ),
    "rocketstore_retention_seconds": (
        "gauge",
        "fileReservedTime: how long CommitLog segments are kept, in seconds",
        (),
    ),
    "rocketstore_disk_used_ratio": (
        "gauge",
        "Used share (0 to 1) of the file system holding the broker directory",
        ("broker",),
    ),
    "rocketstore_disk_max_used_ratio": (
        "gauge",
        "diskMaxUsedSpaceRatio / 100: above it retention deletes the oldest files early",
        ("broker",),
    ),
    "rocketstore_disk_size_bytes": ("gauge", "Size of that file system", ("broker",)),
    "rocketstore_disk_free_bytes": ("gauge", "Bytes free for unprivileged users", ("broker",)),
    "rocketstore_writer_locked": (
        "gauge",
        "1 while a process (a writer) holds the store's lock",
        ("broker",),
    ),
    "rocketstore_abort_file": (
        "gauge",
        "1 while the abort file exists: a writer has the store open, or one did not close it",
        ("broker",),
    ),
    "rocketstore_writer_epoch": (
        "gauge",
        "The newest writer epoch in config/rocketstore-epochs (writers on shared storage)",
        ("broker",),
    ),
    "rocketstore_writer_unclean_takeovers": (
        "counter",
        "Epochs taken from a writer that had not closed the store (it crashed or was fenced)",
        ("broker",),
    ),
    "rocketstore_tier_up": (
        "gauge",
        "1 when the broker's tier figures (its CommitLog and config/rocketstore-tier.json) could "
        "be read at this scrape, else 0; only with the tier on",
        ("broker",),
    ),
    "rocketstore_tier_segments": (
        "gauge",
        "CommitLog segments in each tier: local (files of the store directory) and bucket (named "
        "by the tier's manifest, as the uploader last recorded it)",
        ("broker", "tier"),
    ),
    "rocketstore_tier_bytes": (
        "gauge",
        "Bytes in each tier: local (the segment files' apparent sizes) and bucket (segment and "
        "index objects, as the uploader last recorded them)",
        ("broker", "tier"),
    ),
    "rocketstore_tier_pending_segments": (
        "gauge",
        "Sealed CommitLog segments not uploaded yet",
        ("broker",),
    ),
    "rocketstore_tier_pending_bytes": (
        "gauge",
        "Bytes of the sealed segments not uploaded yet (their files' apparent sizes)",
        ("broker",),
    ),
    "rocketstore_tier_upload_lag_seconds": (
        "gauge",
        "Seconds since the oldest sealed segment not uploaded yet was sealed (0: none waits)",
        ("broker",),
    ),
    "rocketstore_tier_uploaded_offset_bytes": (
        "gauge",
        "uploadedEnd: the CommitLog offset below which every segment is in the bucket",
        ("broker",),
    ),
    "rocketstore_tier_upload_errors": (
        "counter",
        "Upload runs that failed (counted by the uploader in config/rocketstore-tier.json)",
        ("broker",),
    ),
    "rocketstore_tier_last_upload_timestamp_seconds": (
        "gauge",
        "When the uploader last committed a segment to the bucket",
        ("broker",),
    ),
    "rocketstore_tier_last_error_timestamp_seconds": (
        "gauge",
        "When an upload run last failed",
        ("broker",),
    ),
    "rocketmq_consumer_lag_messages": (
        "gauge",
        "Messages a RocketMQ consumer group has still to consume (as rocketstore lag counts)",
        ("consumer_group", "topic", "broker"),
    ),
    "rocketmq_consumer_lag_latency": (
        "gauge",
        "Milliseconds since the oldest message a consumer group has not consumed was stored",
        ("consumer_group", "topic", "broker"),
    ),
    "rocketstore_consumer_queue_lag_messages": (
        "gauge",
        "A consumer group's lag in one queue; per-queue series",
        ("consumer_group", "topic", "broker", "queue_id"),
    ),
    "rocketstore_query_lag_messages": (
        "gauge",
        "Messages a Spark query (by its checkpoint) has still to read",
        ("query", "topic", "broker"),
    ),
    "rocketstore_query_lag_latency": (
        "gauge",
        "Milliseconds since the oldest message a Spark query has not read was stored",
        ("query", "topic", "broker"),
    ),
    "rocketstore_query_queue_lag_messages": (
        "gauge",
        "A Spark query's lag in one queue; per-queue series",
        ("query", "topic", "broker", "queue_id"),
    ),
    "rocketstore_query_committed_batch": (
        "gauge",
        "The last micro-batch the query committed (-1: none yet)",
        ("query",),
    ),
    "rocketstore_query_up": (
        "gauge",
        "1 when the query's checkpoint could be read at this scrape, else 0",
        ("query",),
    ),
    "rocketstore_consumer_offsets_up": (
        "gauge",
        "1 when every broker's config/consumerOffset.json could be read, else 0",
        (),
    ),
    "rocketstore_verify_running": ("gauge", "1 while a verify run is in progress", ()),
    "rocketstore_verify_last_run_timestamp_seconds": (
        "gauge",
        "When the last verify run of the broker ended",
        ("broker",),
    ),
    "rocketstore_verify_ok": (
        "gauge",
        "1 when the last verify run found the broker sound, 0 when it found problems",
        ("broker",),
    ),
    "rocketstore_verify_problems": (
        "gauge",
        "Problems the last verify run found in the broker",
        ("broker",),
    ),
    "rocketstore_per_queue_series": (
        "gauge",
        "1 when per-queue series are exported, 0 when the queues outnumber the limit",
        (),
    ),
    "rocketstore_scrape_duration_seconds": ("gauge", "How long reading the store took", ()),
}


class Families:
    """One scrape's metric families, created on first use, yielded in :data:`FAMILIES`' order."""

    def __init__(self, wanted: frozenset[str] | None) -> None:
        self.wanted = wanted
        self._made: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, name: str, labels: Sequence[str], value: float) -> None:
        if self.wanted is not None and name not in self.wanted:
            return
        family = self._made.get(name)
        if family is None:
            kind, doc, names = FAMILIES[name]
            maker = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = self._made[name] = maker(name, doc, labels=names)
        family.add_metric(list(labels), value)

    def __iter__(self) -> Iterator[Metric]:
        return (self._made[n] for n in FAMILIES if n in self._made)
