"""A partition leader's share-partitions (KIP-932; Kafka's SharePartition and
SharePartitionManager): records acquired, acknowledged and released per share group, and
their state kept at the share group's coordinator.
"""
