"""Numbers from results: statistics, comparison and verdicts, the gate, the figure catalogue,
result documents, frames for notebooks, exports, tables, plots and the HTML page.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
