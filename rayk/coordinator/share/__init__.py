"""The share coordinator: share groups (KIP-932), their members and assignments, and the
share-partition states their leaders keep here (Kafka's share-coordinator; rayk keeps them
in `__consumer_offsets` beside their group).
"""
