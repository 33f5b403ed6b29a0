"""The engine process: everything that runs on the far side of the ZeroMQ link.

process    the spawned process: input thread (recv → decode), busy loop, output thread (encode → send)
core       one step: scheduler → executor → outputs; errors become outputs
scheduler  continuous batching, chunked prefill, KV admission
step       the data a step passes between scheduler and executor
executor   torch (model + vision + sampler) or sim (timed, no model)
model      the Llama-style decoder and its KV cache, model only; one varlen forward per step
device     device/dtype resolution, the GPU-left-unused warning, the memory check, synchronization
staging    host lists to the device in one pinned non-blocking copy; the step's one fetch back
opcount    counts a step's dispatched ops and the ones that make the host wait
vision     the small vision encoder at image placeholders
sampler    temperature/top-k/top-p/min-p, penalties, seeded sampling
config     EngineConfig, the one picklable object the frontend hands the engine
"""
