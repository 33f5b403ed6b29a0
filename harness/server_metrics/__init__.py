"""The server's /metrics: the Prometheus text format, and the engine's setup as it travels to a result."""
