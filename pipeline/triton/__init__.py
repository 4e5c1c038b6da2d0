"""Triton Inference Server plumbing over gRPC (KServe v2 / Open Inference Protocol)."""
