"""rocketstore's streaming and batch source: ``spark.readStream.format("rocketstore")``.

Neither side opens a ``MessageStore``: both read the broker directories' files themselves,
through the file and format layers (``rocketstore.pipeline.files``,
``rocketstore.pipeline.format``), read-only. Opening a store lists every topic, reads the
progress file, maps the CommitLog's tail and, after an unclean end, runs recovery: far more
than a trigger's plan or a task reading one queue's range needs, repeated in every trigger
and task, while a writer in another process (or on another host) appends to the same files.

* The driver plans (``planning``, ``offsets``, ``brokerview``, ``brokercache``): each queue's
  bounds from a few units and record headers, consumer groups' offsets
  (``rocketstore.pipeline.engine.groups``) and the store root's brokers
  (``rocketstore.pipeline.engine.root``); ConsumeQueue offsets are its checkpointed progress.
* Executors read (``read``, ``segfiles``): a partition opens the ConsumeQueue and CommitLog
  files of its range, stops at the offsets the driver planned (which the writer had
  published), and checks every record it decodes, CRC included.

The source's pages: docs/source.md.
"""
