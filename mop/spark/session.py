"""A local SparkSession that works offline and stays on loopback, for tests, examples and benches.

Spark starts its JVM listeners on the machine's first non-loopback address and a web UI on :4040
unless told otherwise, and its Python workers run `python3` from PATH rather than this
interpreter; `local_session` sets all of that before the JVM starts.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

__all__ = ["local_session"]

# WARN at the root keeps Spark from printing its "Setting default log level" banner; the named
# loggers are the ones that warn about normal local-mode situations.
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.nativeloader.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativeloader.level = off
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.rwts.name = org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream
logger.rwts.level = error
logger.mbe.name = org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution
logger.mbe.level = error
logger.mac.name = io.netty.util.internal.MacAddressUtil
logger.mac.level = error
logger.pyds.name = org.apache.spark.sql.execution.datasources.v2.python
logger.pyds.level = error
logger.dag.name = org.apache.spark.scheduler.DAGScheduler
logger.dag.level = error
"""


def local_session(
    app_name: str = "mop",
    *,
    cores: int = 2,
    work_dir: str | os.PathLike[str] | None = None,
    driver_memory: str = "1g",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or return the running) local-mode session: loopback only, no UI, quiet logs.

    `work_dir` holds the warehouse and the log configuration (a fresh temporary directory by
    default). The Python workers run this interpreter and can import the `mop` package this
    process imports, installed or not. Call it before any other code starts a JVM: the
    environment it sets is read only when the JVM starts.
    """
    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="mop-spark-"))
    work.mkdir(parents=True, exist_ok=True)
    log_config = work / "log4j2.properties"
    log_config.write_text(_LOG4J2)
    _prepare_environment()
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.default.parallelism", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(work / "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log_config}")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _prepare_environment() -> None:
    # Without SPARK_LOCAL_IP the block manager and RPC servers bind the first non-loopback
    # address even when spark.driver.bindAddress says otherwise.
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Workers unpickle the data source classes by reference, so they must import the same mop.
    package_root = str(Path(__file__).resolve().parents[2])
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if package_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, *paths]))
