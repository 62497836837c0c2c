"""Integration tests: real servers (gRPC on port 0, redis-server, vLLM) and real processes."""
