"""The compiled modules (everything else is in pyproject.toml): the per-record halves of
the record codec, rayk/storage/_records.c (records from objects, the leader's walk) and
rayk/storage/_columns.c (records from Arrow columns, murmur2), the consumer's iteration,
rayk/client/_hand_out.c, and the producer's send, rayk/client/_send.c. pip builds them
with the machine's C compiler; where there is none the install still succeeds and rayk
runs the same code in Python.

rayk._native, the listener's produce path in Rust (native/, docs/design-notes/
2026-12-03-native-request-path.md), is built by setuptools-rust with the machine's cargo
(rustup's stable toolchain); where there is no cargo it is left out the same way."""

from setuptools import Extension, setup
from setuptools_rust import Binding, RustExtension


def extension(package: str, name: str, depends: tuple[str, ...] = ()) -> Extension:
    return Extension(
        f"rayk.{package}.{name}",
        [f"rayk/{package}/{name}.c"],
        depends=list(depends),
        extra_compile_args=["-O2"],
        optional=True,
    )


setup(
    rust_extensions=[RustExtension("rayk._native", path="native/Cargo.toml", binding=Binding.PyO3, optional=True, debug=False)],
    ext_modules=[
        extension("storage", "_records", depends=("rayk/storage/_varint.h",)),
        extension("storage", "_columns", depends=("rayk/storage/_varint.h", "rayk/storage/_murmur2.h")),
        extension("client", "_hand_out"),
        extension("client", "_send", depends=("rayk/storage/_murmur2.h",)),
    ],
)
