"""Workloads: what the load generator sends, built before the clock starts.

sample    SampleRequest, one prepared request
datasets  sonnet (benchmark_serving's semantics) and random prompts, the flags that choose them
images    deterministic synthetic images and their data URLs
"""
