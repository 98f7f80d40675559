"""AclControlManager: the cluster's ACL bindings (Kafka's AclControlManager).

Owns the bindings, in the order they were created, and `version`: the offset of the
last change, which each listener's authorizer polls to know whether its copy is current.
Plans CreateAcls and DeleteAcls as records; changes only by replaying them. Pure: no
I/O, no Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rayk.acls import AclBinding, AclFilter
from rayk.errors import KafkaError
from rayk.metadata.records import AclRecord, MetadataRecord, RemoveAclRecord


class AclControlManager:
    """The ACL domain of the Controller's image: owns the bindings and their `version`. The
    Controller plans CreateAcls / DeleteAcls with it and ClusterMetadata.apply replays the
    records into it. Pure; the Controller's event loop is its only caller."""

    def __init__(self) -> None:
        self.bindings: dict[AclBinding, None] = {}  # in the order they were created
        self.version = -1  # offset of the last ACL change

    def handlers(self) -> dict[type[MetadataRecord], Callable[[Any, int], None]]:
        return {AclRecord: self._replay_acl, RemoveAclRecord: self._replay_remove_acl}

    def _replay_acl(self, record: AclRecord, offset: int) -> None:
        self.bindings[record.binding] = None
        self.version = offset

    def _replay_remove_acl(self, record: RemoveAclRecord, offset: int) -> None:
        del self.bindings[record.binding]
        self.version = offset

    def image_records(self) -> list[MetadataRecord]:
        return [AclRecord.of(binding) for binding in self.bindings]

    def describe(self, acl_filter: AclFilter) -> list[AclBinding]:
        return [b for b in self.bindings if acl_filter.matches(b)]

    def plan_create_acls(self, bindings: Sequence[AclBinding]) -> tuple[list[MetadataRecord], list[KafkaError | None]]:
        """CreateAcls: per binding None or why it is refused; one that exists already is
        created again as a no-op, as in Kafka."""
        results: list[KafkaError | None] = []
        records: list[MetadataRecord] = []
        new: set[AclBinding] = set()
        for binding in bindings:
            try:
                binding.check()
            except KafkaError as e:
                results.append(e)
                continue
            results.append(None)
            if binding not in self.bindings and binding not in new:
                new.add(binding)
                records.append(AclRecord.of(binding))
        return records, results

    def plan_delete_acls(self, filters: Sequence[AclFilter]) -> tuple[list[MetadataRecord], list[list[AclBinding]]]:
        """DeleteAcls: per filter the bindings it matches (a binding matched by two filters
        is deleted once)."""
        matched = [self.describe(f) for f in filters]
        gone = dict.fromkeys(b for found in matched for b in found)
        return [RemoveAclRecord.of(b) for b in gone], matched
