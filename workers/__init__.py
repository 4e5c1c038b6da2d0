"""Worker kinds: one module per kind of stage (stateless batching, DALI preprocessing, sequences)."""
