"""Kafka plumbing on aiokafka: client construction, topic creation, ordering and commits."""
