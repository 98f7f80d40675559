"""The transaction coordinator (KIP-98/890): transactional ids, their producer ids and epochs,
their transactions and markers, in `__transaction_state` (Kafka's transaction-coordinator).
"""
