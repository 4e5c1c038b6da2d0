"""Command-line client tools: put requests on a topic, read results back (``pipeline produce`` / ``consume``).

Everything here is a *client* of the pipeline, written against the message
contract (:mod:`pipeline.contract`) exactly as a third-party producer would
be: no stage internals, only records, headers and topics. The CLI commands
are thin wrappers; tests and scripts can use these modules directly.
"""
