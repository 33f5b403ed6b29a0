"""One module per ``bench`` command: its flags, its ``main``, its printing. Nothing imports a command module.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
