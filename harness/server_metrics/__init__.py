"""The server's /metrics: the Prometheus text format, and the engine's setup as it travels to a result.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
