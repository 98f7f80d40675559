"""AnswerWriter: writes one data plane connection's answers as they become ready, the
records of a large fetch answer straight from the log file by `sendfile`.

A fetch whose records are at least SENDFILE_MIN_BYTES is handed over as a FileSlice of
the segment's file (rayk/storage/file_slice.py): after the answer's head, the kernel
copies the slice from the page cache to the socket, and the records never enter this
process (Kafka's zero-copy transfer, FileRecords.writeTo by FileChannel.transferTo). On
a TLS connection, where the bytes are encrypted in this process, the slice is read
instead. While a sendfile runs nothing else may be written to the socket (its bytes
would land inside the slice's), so the answers that become ready meanwhile wait for it.

A slice whose log was truncated after it was made no longer holds what its answer would
say. Found before anything of the answer is written (read over TLS, or before its
sendfile starts), the request is answered NOT_LEADER_OR_FOLLOWER (only a leader that
stepped down truncates; the peer asks the new one). Found part way (checked before each
sendfile call; truncations run on this thread), the frame is left short and the
connection aborted, and every later answer on it raises ConnectionAbortedError: the
peer's Connection fails its requests in flight with NETWORK_EXCEPTION and connects again,
as Kafka closes a connection whose FileRecords shrank under its transfer. (The receiver
checks every batch's CRC, as Kafka's does: the last guard against a page the kernel had
not sent yet being rewritten.) An EIO of the file fails the send and is reported to the
slice's owner (`FileSlice.read_failed`), as a failed read of the log is.
"""

from __future__ import annotations

import asyncio
import errno
import os

from rayk.dataplane import frames
from rayk.errors import KafkaError, KafkaStorageError, NotLeaderOrFollowerError
from rayk.storage.file_slice import FileSlice

SMALL_ANSWER_BYTES = 16 * 1024  # records this small are joined to their answer's head: one write


class AnswerWriter:
    """Owns the writing end of one endpoint connection: each answer is written whole,
    never interleaved with another, and awaits the peer taking it (`drain`). `sendfile`
    False (or a TLS connection) reads every slice instead of sending it from the file.
    Once a send from a file has failed part way, or found its log truncated, the
    connection is aborted and every later answer raises ConnectionAbortedError: nothing
    may follow a frame cut short. One event loop's, as the connection."""

    def __init__(self, writer: asyncio.StreamWriter, sendfile: bool = True) -> None:
        self._writer = writer
        self.sendfile = sendfile and writer.get_extra_info("ssl_object") is None
        self._not_sending = asyncio.Event()  # cleared while a sendfile owns the socket
        self._not_sending.set()
        self._aborted = False

    async def write(self, correlation_id: int, head: bytes, tail: bytes | FileSlice) -> None:
        """Writes an answer of `head` and its records `tail`. OSError if the connection
        broke (ConnectionAbortedError: this writer aborted it, see the module's docstring)."""
        if isinstance(tail, FileSlice):
            try:
                await self._wait_for_sendfile()
                if not tail.unchanged():
                    error: KafkaError = NotLeaderOrFollowerError(
                        "this replica's log was truncated (it is no longer the leader) before the answer was sent")
                    await self.write_frame(frames.failed_answer_frame(correlation_id, error))
                    return
                if self.sendfile:
                    await self._send_file(correlation_id, head, tail)
                    return
                try:
                    data = tail.read()  # no truncation meanwhile: those run on this thread too
                except OSError as e:
                    tail.read_failed(e)
                    error = KafkaStorageError(f"a read of the log failed: {e}")
                    await self.write_frame(frames.failed_answer_frame(correlation_id, error))
                    return
            finally:
                tail.close()
            tail = data
        if len(tail) < SMALL_ANSWER_BYTES:
            await self.write_frame(frames.answer_frame_head(correlation_id, head, len(tail)) + tail)  # one syscall
        else:
            await self._wait_for_sendfile()
            # The records are not copied into one buffer with the head, and go in the same
            # syscall (a write each would send, and wake the peer, twice).
            self._writer.writelines((frames.answer_frame_head(correlation_id, head, len(tail)), tail))
            await self._writer.drain()

    async def write_frame(self, frame: bytes) -> None:
        """Writes one whole frame (an answer built in memory)."""
        await self._wait_for_sendfile()
        self._writer.write(frame)
        await self._writer.drain()

    async def _wait_for_sendfile(self) -> None:
        """Returns once no sendfile owns the socket; ConnectionAbortedError if one failed."""
        while not self._not_sending.is_set():
            await self._not_sending.wait()
        if self._aborted:
            raise ConnectionAbortedError("an earlier answer's send from the log file failed: the connection is aborted")

    async def _send_file(self, correlation_id: int, head: bytes, tail: FileSlice) -> None:
        """Called with no sendfile under way and the slice unchanged (no await since)."""
        writer = self._writer
        if writer.transport.is_closing():
            raise ConnectionAbortedError("the connection is closing")
        self._not_sending.clear()
        try:
            answer_head = frames.answer_frame_head(correlation_id, head, len(tail))
            sent = await send_with_file(writer.transport, answer_head, tail)
            if sent != len(tail) or not tail.unchanged():
                raise ConnectionAbortedError(f"sent {sent} of the {len(tail)} bytes of a log slice truncated meanwhile")
        except BaseException:  # part of the frame may have gone: nothing may follow it
            self._aborted = True
            writer.transport.abort()
            raise
        finally:
            self._not_sending.set()
        await writer.drain()


async def send_with_file(transport: asyncio.WriteTransport, head: bytes, tail: FileSlice) -> int:
    """Sends `head`, then `tail` by sendfile, on the transport's socket, once what the
    transport holds is written; returns how many of the slice's bytes went, fewer if its
    log was truncated before they all did (checked before each sendfile call: truncations
    run on this thread). The caller lets nothing else write to the transport meanwhile.
    An EIO of the file is reported to the slice (`read_failed`) and raised.

    asyncio's `loop.sendfile` does this on its own loop, but uvloop, which Ray runs actors
    on, does not implement it; so the socket is written here, through a duplicate of its
    descriptor (a transport's own one cannot be watched by anyone else), waiting for it to
    be writable whenever the kernel's buffer is full."""
    loop = asyncio.get_running_loop()
    out = os.dup(transport.get_extra_info("socket").fileno())
    try:
        while transport.get_write_buffer_size():  # earlier answers, still in the transport's buffer
            await _writable(loop, out)
            await asyncio.sleep(0)  # the transport writes what it can in the same turn
        view = memoryview(head)
        while view:
            try:
                view = view[os.write(out, view):]
            except BlockingIOError:
                await _writable(loop, out)
        sent = 0
        while sent < len(tail) and tail.unchanged():
            try:
                n = os.sendfile(out, tail.fd, tail.position + sent, len(tail) - sent)
            except BlockingIOError:
                await _writable(loop, out)
                continue
            except OSError as e:
                if e.errno == errno.EIO:  # the file's, not the socket's
                    tail.read_failed(e)
                raise
            if n == 0:  # the file ends before the slice does: it was cut
                break
            sent += n
        return sent
    finally:
        os.close(out)


async def _writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    ready = loop.create_future()
    loop.add_writer(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_writer(fd)
