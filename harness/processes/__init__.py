"""What each wirebench process does for itself: freeze its startup heap, stop when its parent is gone,
check the sizes it will take against what the machine has.

Its modules, each with its job: docs/architecture.md (Packages, bottom-up).
"""
