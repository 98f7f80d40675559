"""The coordinators (Kafka's coordinator-common, group-coordinator, share-coordinator and
transaction-coordinator): each hosted by the leader replica of one partition of its internal
topic, replaying that partition on election. What they share is here; each has a folder.
"""
