"""``pipeline bench``: perf_analyzer for a running Kafka topology.

A sweep of load levels (concurrency or request rate) against a topology that
is already running, each step measured twice: through Kafka (request record
sent to the result record's arrival, matched by correlation id, every result
verified) and as direct Triton calls to the topology's first model with the
same requests, so the table shows what the pipeline adds.

* :mod:`.plan`: the sweep's levels and timings, parsed from the flags;
* :mod:`.stats`: one step's outcomes and latency percentiles;
* :mod:`.load`: the load generator (closed loop at a concurrency, open loop at a rate);
* :mod:`.verify`: what makes a result count (decodes, right id, outputs of the right shape);
* :mod:`.kafka_path`, :mod:`.direct`: the two ways a request is made;
* :mod:`.sweep`: runs the steps; :mod:`.report`, :mod:`.plot`: table, JSON, PNG;
* :mod:`.stages`: what the stages saw during each step, from their metrics snapshots
  (read and merged with :mod:`pipeline.tools.top`'s modules).
"""
