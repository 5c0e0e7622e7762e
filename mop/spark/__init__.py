"""Spark data source `mop`: read and write topics of mop (or any Pulsar-protocol service) from
PySpark, in batch and streaming queries, through Spark 4's Python Data Source API.

    import mop.spark
    mop.spark.register(spark)          # once per session
    df = (spark.read.format("mop")
          .option("service_url", "pulsar://127.0.0.1:6650")
          .option("topics", "sensors/+/telemetry")
          .load())

Needs the `spark` extra (pyspark 4.2+, pyarrow) and Java 17 or 21. Importing this package
registers the source with the active session, if there is one.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from mop.spark.datasource import MopDataSource
from mop.spark.options import OptionError
from mop.spark.rows import SCHEMA
from mop.spark.session import local_session

__all__ = ["SCHEMA", "MopDataSource", "OptionError", "local_session", "register"]


def register(spark: SparkSession | None = None) -> SparkSession | None:
    """Make `format("mop")` available in `spark` (default: the active session, if any).

    Returns the session it registered with. Spark keeps data sources per session, so call it
    once for each session the application creates.
    """
    session = spark if spark is not None else SparkSession.getActiveSession()
    if session is not None:
        session.dataSource.register(MopDataSource)
    return session


register()
