"""The Controller actor: the shell over rayk/metadata that orders requests, commits their
records and pushes the results to the brokers (Kafka's QuorumController on one actor).
"""
