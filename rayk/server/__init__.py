"""A broker's parts (Kafka's server): the ReplicaManager actor that owns a broker's replicas
and coordinators on its node, and the pure rules it applies (health, capacity).
"""
