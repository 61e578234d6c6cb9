"""The file layer: the store's files, one module per file kind and the machinery under them.

Segment files mapped or written through descriptors (``mapped_file``, ``segments``,
``mappings``), every sync (``durability``), file-system facts (``filesystem``, ``fileio``,
``visibility``), failure injection for tests (``failpoints``), and the structures on disk: the
CommitLog, ConsumeQueues, IndexFiles, the checkpoint, the progress file, the lock, the store
directory and its config files. Each structure's layout is documented once, in its module.

May import: ``format`` and the package's own modules. Imported by ``engine`` and above, and by
the source, whose executors read segment files without opening a store.
"""
