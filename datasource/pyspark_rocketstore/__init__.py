"""``format("rocketstore")`` with no registration call.

PySpark 4 looks through the installed top-level modules whose names start with ``pyspark_``
and registers the ``DefaultSource`` of each (a ``DataSource`` subclass) under its ``name()``,
in every new session, classic or Spark Connect (``pyspark/sql/worker/lookup_data_sources.py``).
This module is that entry: it only names the data source, whose code is
:mod:`rocketstore.datasource`. Where the lookup is off
(``spark.sql.python.dataSource.lookup.enabled`` or similar settings of a deployment), call
:func:`rocketstore.datasource.register` instead.
"""

from __future__ import annotations

from rocketstore.datasource import RocketStoreDataSource as DefaultSource

__all__ = ["DefaultSource"]
