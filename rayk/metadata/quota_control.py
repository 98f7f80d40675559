"""ClientQuotaControlManager: client quotas (Kafka's ClientQuotaControlManager).

Owns the quota values of each user / client-id entity (rayk/quotas.py) and `version`: the
offset of the last change, which each listener polls to know whether its copy is
current. Plans AlterClientQuotas as records; changes only by replaying them. Pure: no
I/O, no Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rayk.errors import InvalidRequestError, KafkaError
from rayk.metadata.records import ClientQuotaRecord, MetadataRecord
from rayk.quotas import QuotaEntity, QuotaFilterComponent, check_quota_key, check_quota_value, filter_entities


class ClientQuotaControlManager:
    """The client-quota domain of the Controller's image: owns each entity's quota values and
    their `version`. Plans AlterClientQuotas; changes only by replay (ClusterMetadata.apply).
    Pure; called from the Controller's loop."""

    def __init__(self) -> None:
        self.quotas: dict[QuotaEntity, dict[str, float]] = {}  # entity -> key -> value
        self.version = -1  # offset of the last client quota change

    def handlers(self) -> dict[type[MetadataRecord], Callable[[Any, int], None]]:
        return {ClientQuotaRecord: self._replay}

    def _replay(self, record: ClientQuotaRecord, offset: int) -> None:
        entity = record.quota_entity
        values = self.quotas.setdefault(entity, {})
        if record.value is None:
            values.pop(record.key, None)
        else:
            values[record.key] = record.value
        if not values:
            del self.quotas[entity]
        self.version = offset

    def image_records(self) -> list[MetadataRecord]:
        return [ClientQuotaRecord.of(e, key, value) for e, values in self.quotas.items() for key, value in values.items()]

    def describe(self, components: Sequence[QuotaFilterComponent], strict: bool) -> list[tuple[QuotaEntity, dict[str, float]]]:
        """DescribeClientQuotas: the entities the filter matches, with their quotas."""
        return [(e, dict(self.quotas[e])) for e in filter_entities(self.quotas, components, strict)]

    def plan_alter(
        self, alterations: Sequence[tuple[QuotaEntity | KafkaError, Sequence[tuple[str, float | None]]]]
    ) -> tuple[list[MetadataRecord], list[KafkaError | None]]:
        """Kafka's AlterClientQuotas: the records, and per entry None or why all of its
        changes were refused (an entity that did not parse, an unknown key, a value that
        is not a positive number, a key named twice). Removing a key that is not set is
        no error."""
        records: list[MetadataRecord] = []
        results: list[KafkaError | None] = []
        for entity, ops in alterations:
            try:
                if isinstance(entity, KafkaError):
                    raise entity
                keys = [key for key, _ in ops]
                if len(set(keys)) != len(keys):
                    raise InvalidRequestError(f"a quota key is named twice for {entity}")
                for key, value in ops:
                    check_quota_key(key)
                    if value is not None:
                        check_quota_value(key, value)
            except KafkaError as e:
                results.append(e)
                continue
            results.append(None)
            records += [ClientQuotaRecord.of(entity, key, value) for key, value in ops]
        return records, results
