"""Codecs for the records section of Kafka record batches (format v2, magic 2).

This module owns the compression named by bits 0-2 of a v2 batch's `attributes`:

    0 NONE    no compression
    1 GZIP    stdlib `gzip`/`zlib`; a gzip stream (RFC 1952), as Java's GZIPOutputStream
              and kafka-python write. Always available.
    2 SNAPPY  `python-snappy` (import `snappy`) for the raw blocks. Written in the xerial
              framing Kafka's Java client uses (snappy-java SnappyOutputStream): the 16-byte
              header b"\\x82SNAPPY\\x00" + int32 version 1 + int32 compatible version 1, then
              per 32 KiB of input a big-endian int32 length and a raw snappy block. Read
              either that framing or one bare raw snappy block (librdkafka, older clients).
    3 LZ4     `lz4` (`lz4.frame`); the standard LZ4 frame format.
    4 ZSTD    `zstandard`; standard zstd frames, read with a streaming decoder because
              Java's zstd-jni stream writer does not record the content size.

The optional packages are imported at first use, so rayk imports without them; using a
codec whose package is missing raises UnsupportedCompressionTypeError naming what to
install. Undecodable input raises CorruptRecordError; output beyond `max_output_bytes`
raises InvalidRecordError, checked while decoding so a small "bomb" is never fully
inflated in memory.
"""

from __future__ import annotations

import enum
import gzip
import importlib
import struct
import zlib
from types import ModuleType

from rayk.errors import (
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedCompressionTypeError,
)

__all__ = ["CompressionType", "is_available", "compress", "decompress"]


class CompressionType(enum.IntEnum):
    """The codec in bits 0-2 of a v2 record batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str | int | CompressionType | None) -> CompressionType:
        """Parse a codec name (case-insensitive), attribute value 0-4, member or None."""
        if name is None:
            return cls.NONE
        if isinstance(name, str):
            member = cls.__members__.get(name.upper())
            if member is not None:
                return member
        # bool is an int, but True meaning gzip would only ever be a caller's mistake.
        elif isinstance(name, int) and not isinstance(name, bool):
            try:
                return cls(name)
            except ValueError:
                pass
        raise UnsupportedCompressionTypeError(
            f"unknown compression type {name!r}; use one of none, gzip, snappy, lz4, zstd"
        )


# codec -> (module to import, pip distribution that provides it)
_PACKAGES: dict[CompressionType, tuple[str, str]] = {
    CompressionType.SNAPPY: ("snappy", "python-snappy"),
    CompressionType.LZ4: ("lz4.frame", "lz4"),
    CompressionType.ZSTD: ("zstandard", "zstandard"),
}
# Successful lazy imports only: a package installed later is picked up on the next call.
_loaded: dict[CompressionType, ModuleType] = {}

# Output is produced in pieces of at most this size so the max_output_bytes check
# runs before much more than the limit is held in memory.
_CHUNK = 256 * 1024

_GZIP_LEVEL = 6  # Kafka's default (Deflater.DEFAULT_COMPRESSION)
_ZSTD_LEVEL = 3  # Kafka's default (compression.zstd.level)

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024  # snappy-java's default block size, as Kafka uses it
_BLOCK_LENGTH = struct.Struct(">i")

_ZSTD_SKIPPABLE_MASK, _ZSTD_SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50


def _module(codec: CompressionType) -> ModuleType:
    module = _loaded.get(codec)
    if module is not None:
        return module
    module_name, pip_name = _PACKAGES[codec]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnsupportedCompressionTypeError(
            f"{codec.name.lower()} compression needs the '{pip_name}' package: "
            f"pip install {pip_name}"
        ) from exc
    _loaded[codec] = module
    return module


def is_available(codec: CompressionType) -> bool:
    """Whether `codec`'s package can be imported (NONE and GZIP always can)."""
    codec = CompressionType.from_name(codec)
    if codec not in _PACKAGES:
        return True
    try:
        _module(codec)
    except UnsupportedCompressionTypeError:
        return False
    return True


def _bytes_view(data: bytes | memoryview) -> memoryview:
    # A flat byte view, so len() and slicing count bytes whatever the buffer's format.
    return memoryview(data).cast("B")


def compress(codec: CompressionType, data: bytes | memoryview) -> bytes:
    """Compress `data` the way Kafka's Java producer does for `codec`."""
    codec = CompressionType.from_name(codec)
    view = _bytes_view(data)
    if codec is CompressionType.NONE:
        return bytes(view)
    if codec is CompressionType.GZIP:
        # mtime=0 keeps the output a pure function of the input.
        return gzip.compress(view, compresslevel=_GZIP_LEVEL, mtime=0)
    if codec is CompressionType.SNAPPY:
        return _xerial_compress(_module(codec), view)
    if codec is CompressionType.LZ4:
        # Java's Lz4BlockInputStream decodes each block on its own, so linked blocks
        # (python-lz4's default) would be unreadable to Java consumers past 64 KiB.
        return _module(codec).compress(view, block_linked=False)
    return _module(codec).ZstdCompressor(level=_ZSTD_LEVEL).compress(view)


def decompress(
    codec: CompressionType,
    data: bytes | memoryview,
    max_output_bytes: int | None = None,
) -> bytes:
    """Decompress `data` written with `codec`, refusing output over `max_output_bytes`."""
    codec = CompressionType.from_name(codec)
    if max_output_bytes is not None and max_output_bytes < 0:
        raise ValueError(f"max_output_bytes must be >= 0, got {max_output_bytes}")
    view = _bytes_view(data)
    sink = _Sink(codec, max_output_bytes)
    if codec is CompressionType.NONE:
        sink.add(view)
        return bytes(view)
    if codec is CompressionType.GZIP:
        _gunzip(view, sink)
    else:
        module = _module(codec)  # outside the try below: a missing package is not corruption
        decoder, errors = _DECODERS[codec]
        try:
            decoder(module, view, sink)
        except errors(module) as exc:
            raise _corrupt(codec, str(exc) or type(exc).__name__) from exc
    return sink.getvalue()


class _Sink:
    """Collects decompressed pieces and enforces the output bound as they arrive."""

    def __init__(self, codec: CompressionType, limit: int | None) -> None:
        self.codec, self.limit = codec, limit
        self.size = 0
        self.chunks: list[bytes] = []

    def room(self) -> int:
        """How much to ask the decoder for next: one byte past the limit proves a breach."""
        if self.limit is None:
            return _CHUNK
        return max(1, min(_CHUNK, self.limit - self.size + 1))

    def reserve(self, n: int) -> None:
        if self.limit is not None and self.size + n > self.limit:
            raise InvalidRecordError(
                f"{self.codec.name.lower()} data decompresses to more than {self.limit} bytes"
            )

    def add(self, chunk: bytes | memoryview) -> None:
        self.reserve(len(chunk))
        self.size += len(chunk)
        self.chunks.append(chunk)

    def getvalue(self) -> bytes:
        return b"".join(self.chunks)


def _corrupt(codec: CompressionType, why: str) -> CorruptRecordError:
    return CorruptRecordError(f"{codec.name.lower()} data cannot be decompressed: {why}")


def _gunzip(view: memoryview, sink: _Sink) -> None:
    pos, end = 0, len(view)
    try:
        while True:  # one pass per gzip member; Java's GZIPInputStream reads concatenated ones
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header only
            while not inflater.eof:
                # Input goes in by the chunk: zlib copies what max_length leaves unread into
                # unconsumed_tail on every call, which over the whole input would be quadratic.
                todo = inflater.unconsumed_tail
                if not todo and pos < end:
                    todo, pos = view[pos : pos + _CHUNK], min(pos + _CHUNK, end)
                out = inflater.decompress(todo, sink.room())
                if out:
                    sink.add(out)
                elif not todo:
                    raise _corrupt(CompressionType.GZIP, "stream is truncated")
            pos -= len(inflater.unused_data)  # the next member starts there
            if pos == end:
                return
    except zlib.error as exc:
        raise _corrupt(CompressionType.GZIP, str(exc)) from exc


def _xerial_compress(snappy: ModuleType, view: memoryview) -> bytes:
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = snappy.compress(view[start : start + _XERIAL_BLOCK])
        parts += (_BLOCK_LENGTH.pack(len(block)), block)
    return b"".join(parts)


def _snappy_decode(snappy: ModuleType, view: memoryview, sink: _Sink) -> None:
    # Only the magic is checked, not the version fields: some producers (Redpanda) write
    # those little-endian, and snappy-java and kafka-python accept them regardless.
    if len(view) < len(_XERIAL_HEADER) or view[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        _snappy_block(snappy, view, sink)
        return
    pos, end = len(_XERIAL_HEADER), len(view)
    while pos < end:
        if end - pos < _BLOCK_LENGTH.size:
            raise _corrupt(CompressionType.SNAPPY, "xerial block length is truncated")
        (length,) = _BLOCK_LENGTH.unpack_from(view, pos)
        pos += _BLOCK_LENGTH.size
        if length < 0 or length > end - pos:
            raise _corrupt(CompressionType.SNAPPY, f"xerial block of {length} bytes overruns input")
        _snappy_block(snappy, view[pos : pos + length], sink)
        pos += length


def _snappy_block(snappy: ModuleType, block: memoryview, sink: _Sink) -> None:
    # A raw block starts with its uncompressed length (a little-endian base-128 varint of
    # at most 5 bytes); checking it first keeps a bomb block from being inflated at all.
    length = shift = 0
    for byte in block[:5]:
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    else:
        raise _corrupt(CompressionType.SNAPPY, "raw block has no valid length header")
    sink.reserve(length)
    sink.add(snappy.decompress(block))


def _lz4_decode(lz4_frame: ModuleType, view: memoryview, sink: _Sink) -> None:
    pending: bytes | memoryview = view
    while True:  # one pass per concatenated frame
        decoder = lz4_frame.LZ4FrameDecompressor()
        todo = pending
        while not decoder.eof:
            # With max_length the decoder keeps the rest of the input buffered internally.
            out = decoder.decompress(todo, max_length=sink.room())
            todo = b""
            if not out:
                break  # needs input we do not have
            sink.add(out)
        if not decoder.eof:
            raise _corrupt(CompressionType.LZ4, "frame is truncated")
        pending = decoder.unused_data
        if not pending:
            return


def _zstd_decode(zstandard: ModuleType, view: memoryview, sink: _Sink) -> None:
    if not view:
        raise _corrupt(CompressionType.ZSTD, "input is empty")
    # A stream reader never needs the frame's content size and lets read(n) bound the
    # output; read_across_frames matches zstd-jni, which reads concatenated frames.
    reader = zstandard.ZstdDecompressor().stream_reader(view, read_across_frames=True)
    with reader:
        while chunk := reader.read(sink.room()):
            sink.add(chunk)
    # The reader stops quietly when input runs out mid-frame, so check the frames ended.
    if not _zstd_frames_complete(zstandard, view):
        raise _corrupt(CompressionType.ZSTD, "frame is truncated")


def _zstd_frames_complete(zstandard: ModuleType, view: memoryview) -> bool:
    """Walk frame and block headers (RFC 8878 section 3.1) to see the input ends on a frame end."""
    pos, end = 0, len(view)
    while pos < end:
        if end - pos < 8:
            return False  # shorter than any frame header plus a block header
        magic = int.from_bytes(view[pos : pos + 4], "little")
        if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE_MAGIC:
            pos += 8 + int.from_bytes(view[pos + 4 : pos + 8], "little")
            continue
        has_checksum = zstandard.get_frame_parameters(view[pos:]).has_checksum
        pos += zstandard.frame_header_size(view[pos:])
        last = False
        while not last:
            if end - pos < 3:
                return False
            header = int.from_bytes(view[pos : pos + 3], "little")
            last, block_type, size = bool(header & 1), (header >> 1) & 3, header >> 3
            pos += 3 + (1 if block_type == 1 else size)  # an RLE block stores one byte
        pos += 4 if has_checksum else 0
    return pos == end


# codec -> (decoder, the library's exception types for undecodable input)
_DECODERS = {
    CompressionType.SNAPPY: (_snappy_decode, lambda m: m.UncompressError),
    CompressionType.LZ4: (_lz4_decode, lambda m: RuntimeError),
    CompressionType.ZSTD: (_zstd_decode, lambda m: m.ZstdError),
}
