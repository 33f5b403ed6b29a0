"""Workloads: what the load generator sends, built before the clock starts; one module per dataset.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
