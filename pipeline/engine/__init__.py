"""The store engine: ``MessageStore`` and what it runs.

Opening and recovery, puts (``appender``, ``dispatch``), reads, retention and the background
flusher, shared-storage fencing and renewal, a root of broker directories (``root``) and
consumer groups (``groups``).

May import: ``files``, ``format`` and the package's own modules. Imported by ``tools``,
``console``, the sink, the source's driver side and the jobs.
"""
