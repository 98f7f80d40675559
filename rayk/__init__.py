"""rayk: a Kafka-style replicated log broker that runs as Ray actors."""
