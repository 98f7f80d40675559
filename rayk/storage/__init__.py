"""rayk's storage engine: Kafka's segmented log, byte for byte. Never imports ray.

`Log` is one partition's directory of segments; `LogConfig` its settings; `records`
the v2 record batch codec; `checkpoint` Kafka's checkpoint files; `log_cleaner` compaction.
"""

from rayk.storage.log import Log, LogAppendInfo, ReadResult, TimestampOffset
from rayk.storage.log_config import LogConfig

__all__ = ["Log", "LogAppendInfo", "LogConfig", "ReadResult", "TimestampOffset"]
