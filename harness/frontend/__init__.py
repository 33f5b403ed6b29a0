"""The API-server process: HTTP in, EngineCoreRequest out through the codec, outputs back as SSE.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
