"""stream: Chunks merge in order; a RequestStream hands out what queued up as one chunk, ends on a finish
reason or an error, and calls on_abort once when its reader leaves early."""
import asyncio

from labkit.serving.stream import Chunk, RequestStream


def test_chunks_merge_in_order():
    merged = Chunk.merge([Chunk("ab", 2), Chunk("c", 1), Chunk("", 1, "length"), Chunk("", 0, None, "late")])
    assert merged == Chunk("abc", 4, "length", "late")


def test_a_stream_reads_what_queued_up_as_one_chunk_and_ends():
    async def run():
        aborts = []
        stream = RequestStream("r", 3, asyncio.get_running_loop(), on_abort=lambda: aborts.append(1))
        stream.put(Chunk("a", 1))
        stream.put(Chunk("b", 1))
        first = await stream.__anext__()
        stream.put(Chunk("c", 1, "stop"))
        rest = await stream.collect()
        stream.abort()  # finished: nothing to abort
        return first, rest, stream, aborts

    first, rest, stream, aborts = asyncio.run(run())
    assert first == Chunk("ab", 2) and rest == Chunk("c", 1, "stop")
    assert (stream.num_output_tokens, stream.finish_reason, stream.done, aborts) == (3, "stop", True, [])


def test_abort_before_the_end_tells_the_service_once():
    async def run():
        aborts = []
        stream = RequestStream("r", 1, asyncio.get_running_loop(), on_abort=lambda: aborts.append("r"))
        stream.abort()
        stream.abort()
        return aborts, stream.done
    assert asyncio.run(run()) == (["r"], True)
