"""What both processes share: messages and the sampling contract, transport, the shm arena,
CURVE keys, integrity digests, span definitions, metric names, the tokenizer, parent watching."""
