"""A partition replica, as a Ray actor: the leader's produce and fetch paths, the follower's
truncation and copy loop, the ISR and high-watermark rules (Kafka's Partition and
ReplicaFetcherThread). Imports storage/, dataplane/ and actors/; never a coordinator, the
broker or the network front doors.
"""
