"""The one compiled module (everything else is in pyproject.toml): rayk/storage/_records.c,
the per-record halves of the record codec. pip builds it with the machine's C compiler;
where there is none the install still succeeds and rayk uses the same codec in Python."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("rayk.storage._records", ["rayk/storage/_records.c"], extra_compile_args=["-O2"], optional=True)
    ]
)
