"""Codec cost outside the serving loop: payloads, timing against one memcpy, delivery between processes.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
