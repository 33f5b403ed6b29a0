"""The load generator: arrival schedule, streaming client, metrics, report; one job per module.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
