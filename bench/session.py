"""The Spark session of the parts that read the store through Spark (``source``, ``latency``)."""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(app_name: str) -> tuple[Any, bool]:
    """The active session (a test's, reused as it is), or a new ``local[2]`` one, and whether
    the caller made it (and so stops it). Either way ``format("rocketstore")`` is registered."""
    from pyspark.sql import SparkSession

    from datasource import register

    spark = SparkSession.getActiveSession()
    owned = spark is None
    if spark is None:
        # Python workers must run this interpreter (the venv), not whatever is on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName(app_name)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark, owned
