"""``pipeline top``: a live view of a running topology, read from its metrics topic.

Every worker process publishes a JSON snapshot of its metrics to the topology's
``metrics_topic`` every ``metrics_interval_s`` (:mod:`pipeline.observability.snapshot`).
This package turns those snapshots into one row per stage, without Prometheus:

- :mod:`.snapshot` parses one record into plain samples (pure);
- :mod:`.histogram` holds cumulative buckets and reads percentiles from them (pure);
- :mod:`.stage_totals` picks one stage's counters, gauges and histograms out of a snapshot (pure);
- :mod:`.window` differences two snapshots of one process and merges windows per stage (pure;
  ``pipeline bench`` uses it too, for the snapshots inside each load step);
- :mod:`.book` keeps each process's last two snapshots and merges them into a :class:`.book.Frame` (pure);
- :mod:`.view` turns a frame into text lines or a rich table;
- :mod:`.reader` reads the topic with a plain Kafka consumer (no group, nothing committed);
- :mod:`.session` is the refresh loop, showing each frame through a callback.
"""
