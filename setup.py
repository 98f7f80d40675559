"""The compiled modules (everything else is in pyproject.toml), the per-record halves of
the record codec: rayk/storage/_records.c (records from objects, the leader's walk) and
rayk/storage/_columns.c (records from Arrow columns, murmur2). pip builds them with the
machine's C compiler; where there is none the install still succeeds and rayk uses the
same codec in Python."""

from setuptools import Extension, setup


def extension(name: str) -> Extension:
    return Extension(
        f"rayk.storage.{name}",
        [f"rayk/storage/{name}.c"],
        depends=["rayk/storage/_varint.h"],
        extra_compile_args=["-O2"],
        optional=True,
    )


setup(ext_modules=[extension("_records"), extension("_columns")])
