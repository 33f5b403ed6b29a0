"""The frontend's per-request output queue: FIFO, and its idle deadline without a timer per output."""

from __future__ import annotations

import asyncio

from harness.frontend.errors import RequestTimeoutError
from harness.frontend.output_queue import OutputQueue


def test_items_come_out_in_order_and_a_waiting_reader_is_woken() -> None:
    async def main() -> list[object]:
        q = OutputQueue(timeout_s=None)
        q.put_nowait(1)  # type: ignore[arg-type]
        got: list[object] = [await q.get()]
        reader = asyncio.ensure_future(q.get())  # one consumer, waiting on an empty queue
        await asyncio.sleep(0)
        q.put_nowait(2)  # type: ignore[arg-type]
        q.put_nowait(3)  # type: ignore[arg-type]
        got += [await asyncio.wait_for(reader, 5), await q.get()]
        q.close()
        return got

    assert asyncio.run(main()) == [1, 2, 3]


def test_waiting_counts_what_was_put_and_not_yet_taken() -> None:
    # The engine client counts an output taken with the next one waiting as written back to back.
    async def main() -> list[int]:
        q = OutputQueue(timeout_s=None)
        seen = [q.waiting()]
        q.put_nowait(1)  # type: ignore[arg-type]
        q.put_nowait(2)  # type: ignore[arg-type]
        seen.append(q.waiting())
        await q.get()
        seen.append(q.waiting())
        q.close()
        return seen

    assert asyncio.run(main()) == [0, 2, 1]


def test_a_reader_left_waiting_longer_than_the_timeout_gets_a_request_timeout_error() -> None:
    async def main() -> object:
        q = OutputQueue(timeout_s=0.05)
        item = await asyncio.wait_for(q.get(), 5)
        q.close()
        return item

    item = asyncio.run(main())
    assert isinstance(item, RequestTimeoutError)
    assert "0.05 s" in str(item) and "--request-timeout" in str(item)


def test_outputs_that_keep_coming_within_the_timeout_never_time_out() -> None:
    # Outputs every 20 ms for 5 x the 200 ms timeout: the one timer re-arms each time it fires early.
    # (A timeout near the gap would fail on a loaded machine: a stall lets both timers come due.)
    async def main() -> list[object]:
        q = OutputQueue(timeout_s=0.2)

        async def produce() -> None:
            for i in range(50):
                await asyncio.sleep(0.02)
                q.put_nowait(i)  # type: ignore[arg-type]

        producer = asyncio.ensure_future(produce())
        got: list[object] = [await q.get() for _ in range(50)]
        await producer
        q.close()
        return got

    assert asyncio.run(main()) == list(range(50))


def test_close_cancels_the_timer() -> None:
    async def main() -> None:
        q = OutputQueue(timeout_s=0.05)
        q.put_nowait(0)  # type: ignore[arg-type]
        waiter = asyncio.ensure_future(q.get())
        await waiter
        getter = asyncio.ensure_future(q.get())  # arms the timer, then the request ends
        await asyncio.sleep(0)
        getter.cancel()
        q.close()
        assert q._timer is None
        await asyncio.sleep(0.1)  # a fired timer would put an error nobody reads; none is there
        assert not q._items

    asyncio.run(main())


def test_a_consumer_busy_longer_than_the_timeout_still_gets_the_whole_timeout_to_wait() -> None:
    async def main() -> object:
        q = OutputQueue(timeout_s=0.3)
        q.put_nowait(0)  # type: ignore[arg-type]
        await asyncio.sleep(0.5)  # busy elsewhere (e.g. a slow HTTP client) past the timeout
        assert await q.get() == 0
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, q.put_nowait, 1)  # type: ignore[arg-type]  # the next output, 20 ms into the new wait
        item = await asyncio.wait_for(q.get(), 5)
        q.close()
        return item

    assert asyncio.run(main()) == 1
