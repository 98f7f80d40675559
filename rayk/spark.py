"""Spark on Ray (RayDP) and rayk topics: DataFrames in and out.

    spark = rayk.spark.session("clicks", executors=2)
    df = rayk.spark.read_topic(spark, "clicks")                  # Spark's Kafka source schema
    rayk.spark.write_topic(df.selectExpr("key", "upper(value) AS value"), "shouted")
    rayk.spark.stop()

`session` starts Spark on the current Ray cluster with what RayDP needs on Java 17 (the
`--add-opens` flags for driver, executors and RayDP's app master) and with this
interpreter as the executors' Python, so Python UDFs find the same packages.

`read_topic` returns a DataFrame with the schema of Spark's own Kafka source (key binary,
value binary, topic string, partition int, offset long, timestamp timestamp, timestampType
int, headers array<struct<key string, value binary>>) over a snapshot of the topic: the
offsets are fixed when it is called (see rayk.client.offset_ranges). `write_topic` writes
a DataFrame with a `value` column (binary or string) and optional `key`, `partition`,
`headers`, `timestamp` columns, and raises if any record was not acknowledged.

Data moves through Ray Datasets (rayk.data): each topic partition is read by a Ray task
on its leader's node into Arrow, and RayDP hands the Arrow blocks to Spark
(`Dataset.to_spark`); writing goes the other way (`ray.data.from_spark`). Spark
executors never open their own connection to Ray. benchmarks/spark_bench.py measures
this path.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import ray

from rayk import data as rayk_data
from rayk.client.offset_ranges import OffsetSpec

JAVA_17_OPENS = (
    "java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.net", "java.nio",
    "java.math", "java.text", "java.util", "java.util.concurrent", "java.util.concurrent.atomic",
    "jdk.internal.ref", "sun.nio.ch", "sun.nio.cs", "sun.security.action", "sun.util.calendar",
)  # fmt: skip
JAVA_17_OPTIONS = " ".join(
    [f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in JAVA_17_OPENS]
    + ["-Djdk.reflect.useDirectMethodHandle=false", "-Dio.netty.tryReflectionSetAccessible=true"]
)
JAVA_OPTION_KEYS = (
    "spark.driver.extraJavaOptions",
    "spark.executor.extraJavaOptions",
    "spark.ray.raydp_app_master.extraJavaOptions",
)


def session_configs(configs: dict[str, str] | None = None) -> dict[str, str]:
    """RayDP's Spark configs with the Java 17 flags and this interpreter as executor Python;
    Java options the caller gives are kept, after rayk's."""
    out = {
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
    }
    out.update(configs or {})
    for key in JAVA_OPTION_KEYS:
        out[key] = f"{JAVA_17_OPTIONS} {out.get(key, '')}".strip()
    return out


def session(
    app_name: str = "rayk",
    executors: int = 1,
    executor_cores: int = 1,
    executor_memory: str = "1g",
    configs: dict[str, str] | None = None,
) -> Any:
    """Starts Spark on Ray (raydp.init_spark) ready for Java 17; returns the SparkSession.
    Connects to Ray first (`ray.init()`) if this process has not."""
    import raydp

    if not ray.is_initialized():
        ray.init()
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' Python workers
    return raydp.init_spark(
        app_name, executors, executor_cores, executor_memory, configs=session_configs(configs)
    )


def stop() -> None:
    """Stops the Spark session started by `session` (Ray keeps running)."""
    import raydp

    raydp.stop_spark()


def spark_schema() -> Any:
    """The StructType of Spark's Kafka source."""
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType,
    )  # fmt: skip

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )


def read_topic(
    spark: Any,
    topic: str,
    starting_offsets: OffsetSpec = "earliest",
    ending_offsets: OffsetSpec = "latest",
    *,
    starting_timestamp: int | None = None,
    cluster: Any = None,
    records_per_task: int = rayk_data.RECORDS_PER_TASK,
) -> Any:
    """The topic's records in the given bounds, as of now, as a DataFrame (one Spark
    partition per read task: per topic partition, split at `records_per_task`)."""
    ds = rayk_data.read_topic(
        topic, starting_offsets, ending_offsets,
        starting_timestamp=starting_timestamp, cluster=cluster, records_per_task=records_per_task,
    )  # fmt: skip
    if ds.count() == 0:  # to_spark needs at least one block with rows to learn the schema
        return spark.createDataFrame([], spark_schema())
    return ds.to_spark(spark)


def write_topic(df: Any, topic: str, acks: str | int = "all", *, cluster: Any = None, **producer_settings: Any) -> int:
    """Produces every row of `df` to `topic`; returns how many records were written.
    Raises if any record is not acknowledged."""
    missing = {"value"} - set(df.columns)
    if missing:
        from rayk.errors import InvalidConfigurationError

        raise InvalidConfigurationError(f"write_topic needs a 'value' column; the DataFrame has {df.columns}")
    return rayk_data.write_topic(ray.data.from_spark(df), topic, acks=acks, cluster=cluster, **producer_settings)
