"""For test actors that stand in for partition replicas: the data plane endpoint a real
replica has (PartitionReplica.data_endpoint), serving PRODUCE with the actor's
`produce(records, acks, timeout_ms)` and FETCH with its `fetch(offset, max_bytes,
min_bytes, max_wait_ms)`, so that clients reach a fake as they reach a replica."""

from __future__ import annotations

import ray

from rayk.dataplane import frames
from rayk.dataplane.endpoint import Endpoint, EndpointAddress


class FakeReplicaEndpoint:
    _fake_endpoint: Endpoint | None = None

    async def data_endpoint(self, peer_node_id: str | None = None) -> EndpointAddress:
        if self._fake_endpoint is None:
            self._fake_endpoint = Endpoint(self._serve_data_plane, type(self).__name__)
        node_id = ray.get_runtime_context().get_node_id()
        return await self._fake_endpoint.open(node_id, "127.0.0.1", tcp=peer_node_id != node_id)

    async def _serve_data_plane(self, kind: int, body: memoryview) -> tuple[bytes, bytes]:
        if kind == frames.PRODUCE:
            requests = frames.decode_produce_request(body)
            return frames.encode_produce_answer([await self.produce(*request[:3]) for request in requests]), b""
        r = frames.decode_fetch_request(body)
        result = await self.fetch(r.offset, r.max_bytes, r.min_bytes, r.max_wait_ms)
        return frames.encode_fetch_answer_head(result), result.records
