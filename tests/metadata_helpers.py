"""The metadata image as plain values, to compare images built different ways (replay, snapshot, fixture)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from rayk.metadata import records as r


def image_summary(meta: Any) -> dict:
    """The metadata image as plain JSON values, for comparing with the fixture's expectation."""
    return {
        "cluster_id": meta.cluster_id,
        "last_offset": meta.last_offset,
        "brokers": {str(b): [r.epoch, r.node_id, r.incarnation_id, r.directory_id, r.fenced]
                    for b, r in sorted(meta.brokers.items())},
        "topics": {
            name: {
                "topic_id": t.topic_id,
                "configs": meta.configs.of(name),
                "partitions": {str(p): [list(s.replicas), list(s.isr), s.leader, s.leader_epoch, s.partition_epoch,
                                        list(s.recovering), list(s.adding), list(s.removing)]
                               for p, s in sorted(t.partitions.items())},
            }
            for name, t in sorted(meta.topics.items())
        },
        "next_producer_id": meta.producer_ids.next_producer_id,
        "acls": [[b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host, b.operation, b.permission_type]
                 for b in meta.acl.bindings],
        "acl_version": meta.acl.version,
        "scram": {u: {m: [c.salt.hex(), c.stored_key.hex(), c.server_key.hex(), c.iterations] for m, c in sorted(ms.items())}
                  for u, ms in sorted(meta.scram.credentials.items())},
        "client_quotas": sorted([str(e), [list(kv) for kv in sorted(v.items())]] for e, v in meta.quotas.quotas.items()),
        "quota_version": meta.quotas.version,
    }


# Any record of every kind, each field over its type (not only the values a cluster makes).
ids = st.integers(-1, 2**31 - 1)
names = st.text(max_size=20)
brokers = st.tuples(*[st.integers(0, 100)] * 3)
configs = st.dictionaries(names, names, max_size=3)
blobs = st.binary(max_size=40)
entity = st.lists(st.tuples(st.sampled_from(["user", "client-id"]), st.none() | names.filter(bool)),
                  min_size=1, max_size=2).map(tuple)

RECORDS = st.one_of(
    st.builds(r.ClusterIdRecord, names),
    st.builds(r.RegisterBrokerRecord, ids, names, names, names, st.booleans(), st.integers(-1, 2**40)),
    st.builds(r.FenceBrokerRecord, ids, st.booleans()),
    st.builds(r.TopicRecord, names, names, configs),
    st.builds(r.TopicConfigsRecord, names, configs),
    st.builds(r.RemoveTopicRecord, names),
    st.builds(r.PartitionRecord, names, ids, brokers, brokers, ids, ids, ids, brokers, brokers, brokers),
    st.builds(r.ProducerIdsRecord, st.integers(0, 2**62)),
    st.builds(r.AclRecord, ids, names, ids, names, names, ids, ids),
    st.builds(r.RemoveAclRecord, ids, names, ids, names, names, ids, ids),
    st.builds(r.ScramCredentialRecord, names, names, blobs, blobs, blobs, ids),
    st.builds(r.RemoveScramCredentialRecord, names, names),
    st.builds(r.ClientQuotaRecord, entity, names, st.none() | st.floats(allow_nan=False)),
    st.builds(r.DecommissionBrokerRecord, ids, st.booleans()),
    st.builds(r.UnregisterBrokerRecord, ids),
)


def replay_into(manager: Any, records: list, first_offset: int = 0) -> int:
    """Replays `records` into one control manager, as ClusterMetadata.apply would hand
    them to it, at consecutive offsets; returns the next offset."""
    handlers = manager.handlers()
    for i, record in enumerate(records):
        handlers[type(record)](record, first_offset + i)
    return first_offset + len(records)
