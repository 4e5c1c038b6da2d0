"""The S3 (MinIO) model store in Triton's model repository layout."""
