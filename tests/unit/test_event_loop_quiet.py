"""A failing worker's last line stays its one-line error (pipeline/runtime/event_loop.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiokafka.util

from pipeline.runtime.event_loop import quiet_unretrieved_kafka_errors


def _handled(future: asyncio.Future[Any], exception: BaseException) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    loop.default_exception_handler = seen.append  # type: ignore[method-assign]
    quiet_unretrieved_kafka_errors(
        loop, {"message": "Task exception was never retrieved", "exception": exception, "future": future}
    )
    loop.close()
    return seen


def test_aiokafkas_own_unretrieved_task_failures_go_to_the_debug_log_and_others_do_not() -> None:
    async def main() -> None:
        closed = RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

        async def ours() -> None:
            raise closed

        # A task running one of aiokafka's own coroutines (its module's file is under aiokafka/).
        theirs = asyncio.ensure_future(aiokafka.util.wait_for(asyncio.sleep(0), timeout=1))
        await theirs
        assert _handled(theirs, closed) == []
        mine = asyncio.ensure_future(ours())
        await asyncio.gather(mine, return_exceptions=True)
        assert len(_handled(mine, closed)) == 1  # not aiokafka's: asyncio's default handler reports it

    asyncio.run(main())
