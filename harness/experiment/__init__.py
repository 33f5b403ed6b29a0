"""One experiment flow: arms (codec × transport × build), server processes and their flags,
the capacity probe, rounds and blocks; ``run``, ``calibrate`` and ``sweep`` all call it with typed settings.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
