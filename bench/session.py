"""The Spark session of the parts that run Spark (``sink``, ``sink-batch``, ``source``,
``latency``)."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(app_name: str, **conf: str) -> tuple[Any, bool]:
    """The active session (a test's, reused as it is), or a new ``local[2]`` one with ``conf``
    over the defaults below, and whether the caller made it (and so stops it). Either way
    ``format("rocketstore")`` is registered."""
    from pyspark.sql import SparkSession

    from rocketstore.datasource import register

    spark = SparkSession.getActiveSession()
    owned = spark is None
    if spark is None:
        # Python workers must run this interpreter (the venv), not whatever is on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings = {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "4",
            **conf,
        }
        builder = SparkSession.builder.master("local[2]").appName(app_name)
        for key, value in settings.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark, owned
