"""Workloads: what the load generator sends, built before the clock starts.

spec            WorkloadSpec, the workload as one frozen value (common settings + the dataset's own)
base            the Dataset protocol, the Sampling each dataset is given, shared flag checks
registry        dataset names to datasets: built-ins, register_dataset, the wirebench.datasets entry points
sonnet          sonnet prompts (benchmark_serving's semantics); random_dataset: random prompts
random_mm       random prompts with drawn counts and sizes of synthetic images (vLLM's random-mm)
sharegpt, custom, trace   replayed from a file: ShareGPT JSON, JSONL requests, a Mooncake trace (files)
datasets        the workload flags, build_workload, load_workload
chat, images    a request's chat message and its token count; synthetic images, their data URLs, reuse
sample          SampleRequest, one prepared request
progress        what a long build shows while it runs (bars on a terminal, else one line)
"""
