"""The `mop` data source: Spark's entry point to the readers and writers of this package."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from mop.spark.batch import MopBatchReader
from mop.spark.options import OptionError, parse_read_options, parse_write_options
from mop.spark.rows import SCHEMA
from mop.spark.sink import MopStreamWriter, MopWriter, check_schema
from mop.spark.stream import MopStreamReader

__all__ = ["MopDataSource"]


class MopDataSource(DataSource):
    """Topics of a Pulsar-protocol service (a mop node, a mop broker cluster, Apache Pulsar)
    as a Spark table: batch and streaming, read and write.

    Options are parsed when Spark asks for a reader or writer, so a bad option fails the
    `load()` / `save()` / `start()` call rather than a task.
    """

    @classmethod
    def name(cls) -> str:
        return "mop"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return MopBatchReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MopStreamReader(parse_read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError("a topic cannot be overwritten: use mode('append')")
        options = parse_write_options(self.options)
        check_schema(schema, options)
        return MopWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = parse_write_options(self.options)
        check_schema(schema, options)
        return MopStreamWriter(options)
