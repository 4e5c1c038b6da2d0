"""Dead letters that do not fit in Kafka: claim checks in the S3 store.

``claim_check`` stores a payload under a deterministic name and says where it
went; ``oversize`` turns outputs too large for their topic into claim-check
dead letters for the outbox.
"""
