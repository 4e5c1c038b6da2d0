"""The embedded real stack: a Kafka-protocol broker, an S3 model store and Triton, as child processes."""
