"""Keeping a process's startup heap out of the garbage collector's way."""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Collect now, then move every object alive into the collector's permanent generation.

    A full (generation-2) collection walks every tracked object; after startup most of them are
    imports, the model and the app, which never become garbage. Frozen, they are not walked. In the
    seed preset's runs here the engine, its heap not frozen, stopped for a full collection of tens
    of ms during the load; frozen, it did not (scripts/studies/gc_pauses/). vLLM's API server and engine
    freeze theirs since 2025 (vllm-project/vllm#12287, #24008), and benchmark_serving its client's.
    """
    gc.collect()
    gc.freeze()
