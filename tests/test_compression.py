"""Tests for rayk.storage.compression: Kafka v2 batch codecs, interop and failure modes."""

from __future__ import annotations

import gzip
import io
import random
import struct
import subprocess
import sys
import tracemalloc

import kafka.codec
import pytest
import snappy
import zstandard
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rayk.errors import (
    CorruptRecordError,
    InvalidRecordError,
    KafkaError,
    UnsupportedCompressionTypeError,
)
from rayk.storage import compression
from rayk.storage.compression import CompressionType, compress, decompress, is_available

ALL = list(CompressionType)
COMPRESSED = [c for c in CompressionType if c is not CompressionType.NONE]
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)

# Just past 64 KiB so snappy needs three 32 KiB xerial blocks and lz4 two 64 KiB blocks.
BIG = random.Random(7).randbytes(70_000)
PAYLOADS = {
    "one-byte": b"x",
    "text": b"key=value;" * 50,
    "random-70k": BIG,
    "repetitive-300k": b"rayk log segment " * 20_000,
}


def _available(codec: CompressionType) -> CompressionType:
    if not is_available(codec):
        pytest.skip(f"{codec.name} package not installed")
    return codec


def _randbytes(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _repeat(unit: bytes, size: int) -> bytes:
    return (unit * (size // len(unit) + 1))[:size]


# Hypothesis caps drawn data near 8 KiB, so large inputs are built from a seed or a unit.
binary_payloads = st.one_of(
    st.binary(max_size=4096),
    st.builds(_randbytes, st.integers(0, 2**32), st.integers(64 * 1024, 160 * 1024)),
    st.builds(_repeat, st.binary(min_size=1, max_size=64), st.integers(64 * 1024, 300 * 1024)),
)


# --- round trip -----------------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL, ids=lambda c: c.name)
@settings(max_examples=50, deadline=None)
@given(data=binary_payloads)
@example(data=b"")
@example(data=BIG)
def test_decompress_inverts_compress(codec: CompressionType, data: bytes) -> None:
    _available(codec)
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", ALL, ids=lambda c: c.name)
def test_memoryview_input_is_accepted(codec: CompressionType) -> None:
    _available(codec)
    data = b"0123456789" * 1000
    packed = compress(codec, memoryview(data))
    assert decompress(codec, memoryview(packed)) == data


def test_none_returns_input_unchanged() -> None:
    assert compress(CompressionType.NONE, b"abc") == b"abc"
    assert decompress(CompressionType.NONE, memoryview(b"abc")) == b"abc"


# --- interop with kafka-python's codecs ---------------------------------------------

KAFKA_PYTHON = {
    CompressionType.GZIP: (kafka.codec.gzip_encode, kafka.codec.gzip_decode),
    CompressionType.SNAPPY: (
        lambda data: kafka.codec.snappy_encode(data, xerial_compatible=True),
        kafka.codec.snappy_decode,
    ),
    CompressionType.LZ4: (kafka.codec.lz4_encode, kafka.codec.lz4_decode),
    CompressionType.ZSTD: (kafka.codec.zstd_encode, kafka.codec.zstd_decode),
}


@pytest.mark.parametrize("payload", list(PAYLOADS) + ["empty"])
@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.name)
def test_decodes_what_kafka_python_encodes(codec: CompressionType, payload: str) -> None:
    _available(codec)
    data = PAYLOADS.get(payload, b"")
    encode, _ = KAFKA_PYTHON[codec]
    assert decompress(codec, encode(data)) == data


# No empty payload here: kafka-python cannot read back even its own header-only xerial stream.
@pytest.mark.parametrize("payload", list(PAYLOADS))
@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.name)
def test_kafka_python_decodes_what_we_encode(codec: CompressionType, payload: str) -> None:
    _available(codec)
    data = PAYLOADS[payload]
    _, decode = KAFKA_PYTHON[codec]
    assert decode(compress(codec, data)) == data


# --- format details -------------------------------------------------------------------


def test_snappy_writes_xerial_framing_in_32k_blocks() -> None:
    _available(CompressionType.SNAPPY)
    packed = compress(CompressionType.SNAPPY, BIG)
    assert packed[:16] == XERIAL_HEADER
    pos, sizes = 16, []
    while pos < len(packed):
        (length,) = struct.unpack_from(">i", packed, pos)
        sizes.append(len(snappy.decompress(packed[pos + 4 : pos + 4 + length])))
        pos += 4 + length
    assert pos == len(packed)
    assert sizes == [32768, 32768, len(BIG) - 65536]


def test_raw_snappy_block_is_decoded() -> None:
    _available(CompressionType.SNAPPY)
    raw = snappy.compress(BIG)
    assert not raw.startswith(b"\x82SNAPPY")
    assert decompress(CompressionType.SNAPPY, raw) == BIG


def test_xerial_header_with_little_endian_versions_is_accepted() -> None:
    _available(CompressionType.SNAPPY)
    block = snappy.compress(b"redpanda")
    packed = b"\x82SNAPPY\x00" + struct.pack("<ii", 1, 1) + struct.pack(">i", len(block)) + block
    assert decompress(CompressionType.SNAPPY, packed) == b"redpanda"


def test_lz4_frames_use_independent_blocks_for_java_consumers() -> None:
    _available(CompressionType.LZ4)
    packed = compress(CompressionType.LZ4, BIG)
    assert packed[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
    assert packed[4] & 0x20, "FLG block-independence bit must be set"


def test_zstd_frame_without_content_size_is_decoded() -> None:
    _available(CompressionType.ZSTD)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(BIG)
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert decompress(CompressionType.ZSTD, frame) == BIG


def test_zstd_stream_writer_output_is_decoded() -> None:
    _available(CompressionType.ZSTD)
    sink = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(sink, closefd=False) as writer:
        writer.write(BIG[:1000])
        writer.write(BIG[1000:])
    assert decompress(CompressionType.ZSTD, sink.getvalue()) == BIG


def test_concatenated_zstd_frames_are_all_decoded() -> None:
    _available(CompressionType.ZSTD)
    packed = compress(CompressionType.ZSTD, b"first") + compress(CompressionType.ZSTD, b"second")
    assert decompress(CompressionType.ZSTD, packed) == b"firstsecond"


def test_concatenated_gzip_members_are_all_decoded() -> None:
    packed = gzip.compress(b"first") + gzip.compress(b"second")
    assert decompress(CompressionType.GZIP, packed) == b"firstsecond"


# --- corrupt input --------------------------------------------------------------------


def _flip_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


def _xerial_overrun() -> bytes:
    return XERIAL_HEADER + struct.pack(">i", 1000) + b"short"


CORRUPT_CASES = {
    "gzip-garbage": (CompressionType.GZIP, lambda: b"definitely not gzip"),
    "gzip-empty": (CompressionType.GZIP, lambda: b""),
    "gzip-truncated": (CompressionType.GZIP, lambda: compress(CompressionType.GZIP, BIG)[:-100]),
    "gzip-bit-flip": (CompressionType.GZIP, lambda: _flip_middle(gzip.compress(BIG))),
    "gzip-trailing-garbage": (CompressionType.GZIP, lambda: gzip.compress(b"x") + b"junk"),
    "snappy-raw-garbage": (CompressionType.SNAPPY, lambda: b"\x10not snappy at all"),
    "snappy-bad-length-varint": (CompressionType.SNAPPY, lambda: b"\xff" * 8),
    "snappy-empty": (CompressionType.SNAPPY, lambda: b""),
    "snappy-xerial-overrun": (CompressionType.SNAPPY, _xerial_overrun),
    "snappy-xerial-torn-length": (CompressionType.SNAPPY, lambda: XERIAL_HEADER + b"\x00\x00"),
    "snappy-xerial-bad-block": (
        CompressionType.SNAPPY,
        lambda: XERIAL_HEADER + struct.pack(">i", 6) + b"\x10abcde",
    ),
    "lz4-garbage": (CompressionType.LZ4, lambda: b"definitely not lz4"),
    "lz4-empty": (CompressionType.LZ4, lambda: b""),
    "lz4-truncated": (CompressionType.LZ4, lambda: compress(CompressionType.LZ4, BIG)[:-100]),
    "zstd-garbage": (CompressionType.ZSTD, lambda: b"definitely not zstd"),
    "zstd-empty": (CompressionType.ZSTD, lambda: b""),
    "zstd-truncated": (CompressionType.ZSTD, lambda: compress(CompressionType.ZSTD, BIG)[:-100]),
    "zstd-trailing-bytes": (CompressionType.ZSTD, lambda: compress(CompressionType.ZSTD, b"x") + b"\0"),
}


@pytest.mark.parametrize("case", list(CORRUPT_CASES))
def test_corrupt_input_raises_corrupt_record_error_naming_codec(case: str) -> None:
    codec, make = CORRUPT_CASES[case]
    _available(codec)
    with pytest.raises(CorruptRecordError, match=codec.name.lower()):
        decompress(codec, make())


# --- output bound ---------------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL, ids=lambda c: c.name)
def test_output_over_max_output_bytes_raises_invalid_record(codec: CompressionType) -> None:
    _available(codec)
    packed = compress(codec, BIG)
    with pytest.raises(InvalidRecordError, match=f"more than {len(BIG) - 1} bytes"):
        decompress(codec, packed, max_output_bytes=len(BIG) - 1)


@pytest.mark.parametrize("codec", ALL, ids=lambda c: c.name)
def test_output_of_exactly_max_output_bytes_is_allowed(codec: CompressionType) -> None:
    _available(codec)
    assert decompress(codec, compress(codec, BIG), max_output_bytes=len(BIG)) == BIG


def test_raw_snappy_block_over_bound_raises_invalid_record() -> None:
    _available(CompressionType.SNAPPY)
    with pytest.raises(InvalidRecordError):
        decompress(CompressionType.SNAPPY, snappy.compress(BIG), max_output_bytes=1000)


BOMB_SIZE = 16 * 1024 * 1024
BOMB_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def bombs() -> dict[CompressionType, bytes]:
    zeros = bytes(BOMB_SIZE)
    bombs = {c: compress(c, zeros) for c in COMPRESSED if is_available(c)}
    if is_available(CompressionType.SNAPPY):
        bombs[CompressionType.SNAPPY] = snappy.compress(zeros)  # one raw 16 MiB block
    return bombs


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.name)
def test_bound_is_enforced_before_inflating_everything(
    codec: CompressionType, bombs: dict[CompressionType, bytes]
) -> None:
    _available(codec)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRecordError):
            decompress(codec, bombs[codec], max_output_bytes=BOMB_LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, f"peak {peak} bytes suggests the whole bomb was inflated"


def test_negative_max_output_bytes_is_rejected() -> None:
    with pytest.raises(ValueError):
        decompress(CompressionType.GZIP, gzip.compress(b"x"), max_output_bytes=-1)


# --- names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (None, CompressionType.NONE),
        ("none", CompressionType.NONE),
        ("NONE", CompressionType.NONE),
        ("gzip", CompressionType.GZIP),
        ("GZip", CompressionType.GZIP),
        ("snappy", CompressionType.SNAPPY),
        ("LZ4", CompressionType.LZ4),
        ("zstd", CompressionType.ZSTD),
        (0, CompressionType.NONE),
        (4, CompressionType.ZSTD),
        (CompressionType.SNAPPY, CompressionType.SNAPPY),
    ],
)
def test_from_name_accepts_documented_spellings(name: object, expected: CompressionType) -> None:
    assert CompressionType.from_name(name) is expected


@pytest.mark.parametrize("name", ["x", "", "gzip2", "producer", 5, -1, True, 1.0])
def test_from_name_rejects_other_values(name: object) -> None:
    with pytest.raises(UnsupportedCompressionTypeError) as info:
        CompressionType.from_name(name)
    assert f"unknown compression type {name!r}; use one of none, gzip, snappy, lz4, zstd" in str(
        info.value
    )


def test_attribute_values_are_kafkas() -> None:
    assert [int(c) for c in CompressionType] == [0, 1, 2, 3, 4]
    assert [c.name for c in CompressionType] == ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD"]


def test_errors_are_kafka_errors_with_wire_codes() -> None:
    with pytest.raises(KafkaError) as info:
        decompress(CompressionType.GZIP, b"junk")
    assert info.value.code == 2  # CORRUPT_MESSAGE


# --- missing packages -----------------------------------------------------------------

MISSING = [
    (CompressionType.SNAPPY, "snappy", "python-snappy"),
    (CompressionType.LZ4, "lz4.frame", "lz4"),
    (CompressionType.ZSTD, "zstandard", "zstandard"),
]


@pytest.fixture
def unloaded(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setattr(compression, "_loaded", {})
    return monkeypatch


@pytest.mark.parametrize(("codec", "module", "pip_name"), MISSING, ids=lambda v: str(v))
def test_missing_package_makes_codec_unavailable(
    unloaded: pytest.MonkeyPatch, codec: CompressionType, module: str, pip_name: str
) -> None:
    unloaded.setitem(sys.modules, module, None)
    assert is_available(codec) is False
    assert is_available(CompressionType.GZIP) is True
    assert is_available(CompressionType.NONE) is True


@pytest.mark.parametrize(("codec", "module", "pip_name"), MISSING, ids=lambda v: str(v))
def test_missing_package_raises_unsupported_naming_the_install(
    unloaded: pytest.MonkeyPatch, codec: CompressionType, module: str, pip_name: str
) -> None:
    packed = compress(codec, b"payload")  # made while the package is still importable
    unloaded.setattr(compression, "_loaded", {})
    unloaded.setitem(sys.modules, module, None)
    hint = f"{codec.name.lower()} compression needs the '{pip_name}' package: pip install {pip_name}"
    with pytest.raises(UnsupportedCompressionTypeError, match=hint):
        compress(codec, b"payload")
    with pytest.raises(UnsupportedCompressionTypeError, match=hint):
        decompress(codec, packed)


def test_module_imports_and_gzips_without_optional_packages() -> None:
    script = (
        "import sys\n"
        "for name in ('snappy', 'lz4', 'lz4.frame', 'zstandard'):\n"
        "    sys.modules[name] = None\n"
        "from rayk.storage.compression import CompressionType as C, compress, decompress, is_available\n"
        "assert decompress(C.GZIP, compress(C.GZIP, b'ok')) == b'ok'\n"
        "assert not any(is_available(c) for c in (C.SNAPPY, C.LZ4, C.ZSTD))\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
