"""Tiered storage: sealed CommitLog segments in an S3 bucket (docs/tiering.md).

A layer between ``files`` (which it reads, read-only) and ``engine``: ``remote`` is the read
side (the tier as a ``SegmentDir``, its queues, keys and times).
"""
