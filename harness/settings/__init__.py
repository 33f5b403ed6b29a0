"""How a setting is declared once: its field carries its flag, help, default and comparability.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
