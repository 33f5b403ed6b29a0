#!/usr/bin/env python
"""The physical reference for the wire: a bare pyzmq send → receive of a message's frames between two processes.

    .venv/bin/python scripts/studies/zmq_reference/zmq_reference.py [--codec msgspec-oob] \\
        [--payload tensor-fp32-1024] [--iterations 200]

The frames are what the codec makes of one of ``bench micro``'s payloads (by
default the 1024×1024 fp32 pixel tensor request, 12.6 MB); a sender process
PUSHes them over an ipc socket in a private temporary directory exactly as the
frontend's engine client does (``send_multipart(copy=False)``) and a receiver
process PULLs them as the engine's input thread does (``recv_multipart(copy=False)``).
One way = receive returned − send called, both on CLOCK_MONOTONIC, the same
definition as the IPC budget's "request wire" (``harness.wire.spans``). Sends are
paced (one in flight at a time), so no queueing enters the figure. Also
printed: one memcpy of the same bytes, the floor of any copy.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import tempfile
import time
from multiprocessing.connection import Connection

import numpy as np
import zmq

import wirecodecs
from harness.micro.payloads import PAYLOADS
from harness.wire.zmq_link import frames_nbytes


def receiver(address: str, iterations: int, conn: Connection) -> None:
    ctx: zmq.Context = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.bind(address)
    conn.send("ready")
    times = []
    for _ in range(iterations):
        sock.recv_multipart(copy=False)
        times.append(time.monotonic_ns())
        conn.send(times[-1])  # the sender waits for it: one message in flight
    sock.close(linger=0)
    ctx.term()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--codec", default="msgspec-oob")
    p.add_argument("--payload", default="tensor-fp32-1024", choices=list(PAYLOADS))
    p.add_argument("--iterations", type=int, default=200)
    args = p.parse_args()

    msg = PAYLOADS[args.payload]()
    frames = wirecodecs.get_codec(args.codec).encode(msg)
    nbytes = frames_nbytes(frames)
    folder = tempfile.mkdtemp(prefix="wirebench-zmqref-")
    address = f"ipc://{folder}/ref"
    ctx_mp = mp.get_context("spawn")
    parent, child = ctx_mp.Pipe()
    proc = ctx_mp.Process(target=receiver, args=(address, args.iterations, child), daemon=True)
    proc.start()
    try:
        assert parent.recv() == "ready"
        ctx: zmq.Context = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.connect(address)
        one_way = []
        for _ in range(args.iterations):
            start = time.monotonic_ns()
            sock.send_multipart([b"\x00", *frames], copy=False)
            one_way.append(parent.recv() - start)
        sock.close(linger=0)
        ctx.term()
    finally:
        proc.join(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
    src = np.full(nbytes, 7, dtype=np.uint8)
    dst = np.empty_like(src)
    copies = []
    for _ in range(max(20, args.iterations // 4)):
        t0 = time.monotonic_ns()
        np.copyto(dst, src)
        copies.append(time.monotonic_ns() - t0)
    us = np.array(one_way) / 1e3
    print(
        f"{args.codec} {args.payload}: {len(frames)} frames, {nbytes:,} bytes; bare pyzmq ipc one way "
        f"p50 {np.percentile(us, 50):,.1f} µs, p99 {np.percentile(us, 99):,.1f} µs over {len(us)} sends; "
        f"one memcpy p50 {np.percentile(np.array(copies) / 1e3, 50):,.1f} µs"
    )


if __name__ == "__main__":
    main()
