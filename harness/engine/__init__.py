"""The engine process: everything that runs on the far side of the ZeroMQ link.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
