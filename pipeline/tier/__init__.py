"""Tiered storage: sealed CommitLog segments in an S3 bucket (docs/tiering.md).

A layer between ``files`` (which it reads, read-only) and ``engine`` (which asks it only
for the retention gate and the early roll): ``objects`` is the one face of S3, ``manifest`` the
bucket's record of what it holds, ``localstate`` the store's own record of what is uploaded,
``upload`` the uploader, ``remote`` the read side (the tier as a ``SegmentDir``, its
queues, keys and times).
"""
