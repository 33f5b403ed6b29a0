"""The tokenizers shared by the frontend, the load generator and the datasets (tekken among them).

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
