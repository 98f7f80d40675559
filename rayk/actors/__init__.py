"""Ray actors: Controller, ReplicaManager (one per broker) and PartitionReplica."""
