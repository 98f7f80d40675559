"""Coverage-guided fuzzing of the compiled record codec, then its corpus under AddressSanitizer.

`rayk/storage/_records.c` is the native code that meets untrusted bytes: a leader walks
the records of every batch a client produces with it (`scan_records`, before anything is
appended), and consumers decode what they fetch. Two phases:

1. **Explore.** libFuzzer (through atheris) feeds the compiled module arbitrary record
   sections and record counts; for each input every compiled walk and decoder must give
   the Python reference's verdict, message and records
   (`tests.test_compiled_records.assert_same`), and must not crash. The fuzzer is guided
   by the coverage of the Python reference, which takes the C walk's branches check for
   check; it starts from well-formed sections and the known defects of
   `tests.test_records.MALFORMED`, and keeps every input that reached new code.
2. **Check under the sanitizers.** The module is built again with gcc's AddressSanitizer
   and UndefinedBehaviorSanitizer, and every input the exploration kept (and the seeds),
   cut at every length, goes through `assert_same` again: a read or write outside a
   buffer, or an overflow, aborts with the sanitizer's report. (The sanitizers' runtime would take over the
   coverage hooks libFuzzer needs, so the two phases run in separate processes.)

    python -m tests.fuzz.compiled_records --seconds 60

exits non-zero on a disagreement, a crash or a sanitizer report, leaving the input that
caused it in the working directory (libFuzzer's crash-<sha1>, or named in the report);
`--runs N` explores N inputs instead of a time. `make fuzz` runs it (part of `make chaos`);
tests/test_fuzz_harness.py runs it briefly in `make test` so it cannot rot.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SANITIZE = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
MAX_RECORD_COUNT = 48
ENV_BUILD = "RAYK_FUZZ_SANITIZED_BUILD"  # set in the re-executed process: where the build is


def build_sanitized(out: Path) -> Path:
    """Compiles rayk/storage/_records.c with the sanitizers into `out`; its path. With gcc
    directly, with the flags setup.py's build_ext uses (Python's -fwrapv -DNDEBUG, then
    -O2), but that module alone: build_ext builds every compiled module and the Rust crate,
    ~6 s more here."""
    built = out / "lib" / "rayk" / "storage" / f"_records{sysconfig.get_config_var('EXT_SUFFIX')}"
    built.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-fwrapv", "-DNDEBUG", "-O2", *SANITIZE.split(), f"-I{sysconfig.get_paths()['include']}",
         str(REPO / "rayk" / "storage" / "_records.c"), "-o", str(built)],
        check=True,
    )  # fmt: skip
    assert b"__asan_report_load" in built.read_bytes(), f"{built} was built without AddressSanitizer"
    return built


def sanitizer_runtimes() -> str:
    """gcc's ASan and UBSan runtimes, preloaded into Python (which is not built with them)."""
    paths = [subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()
             for name in ("libasan.so", "libubsan.so")]
    missing = [p for p in paths if not os.path.isabs(p)]
    if missing:
        raise SystemExit(f"gcc's sanitizer runtimes were not found ({missing}): apt-get install gcc")
    return ":".join(paths)


def seeds(corpus: Path) -> None:
    """Well-formed record sections of a few shapes, and each known defect."""
    from rayk.storage.records import HEADER_SIZE_BYTES, SimpleRecord, build_batch
    from tests.test_records import MALFORMED

    shapes = [
        [SimpleRecord(b"v")],
        [SimpleRecord(b"value", key=b"key", timestamp_ms=1_000 + i) for i in range(3)],
        [SimpleRecord(None, key=b"k", headers=[("h", b"x"), ("ü", None)], timestamp_ms=5)],
        [SimpleRecord(b"x" * 300, timestamp_ms=(1 << 40) + i) for i in range(2)],
    ]
    for i, records in enumerate(shapes):
        body = build_batch(records)[HEADER_SIZE_BYTES:]
        (corpus / f"shape-{i}").write_bytes(bytes([len(records)]) + body)
    for i, make in enumerate(MALFORMED.values()):
        batch = make()
        count = int.from_bytes(batch[57:61], "big", signed=True)
        (corpus / f"defect-{i}").write_bytes(bytes([count % 256]) + batch[HEADER_SIZE_BYTES:])


def explore(libfuzzer_args: list[str]) -> None:
    """Phase 1, in a process of its own: libFuzzer over the compiled module as built."""
    import atheris

    with atheris.instrument_imports(include=["rayk.storage.records"]):
        from rayk.storage import records
    from tests.test_compiled_records import assert_same

    assert not isinstance(records._records, types.SimpleNamespace), "rayk.storage._records is not built: `make`"

    def one_input(data: bytes) -> None:
        if data:
            assert_same(data[1:], data[0] % (MAX_RECORD_COUNT + 1))

    atheris.Setup([sys.argv[0], *libfuzzer_args], one_input)
    atheris.Fuzz()


def check(corpus: str) -> None:
    """Phase 2, in a process with the sanitizers' runtimes preloaded: every input of
    `corpus` through the sanitized build."""
    spec = importlib.util.spec_from_file_location("rayk.storage._records", os.environ[ENV_BUILD])
    assert spec is not None and spec.loader is not None
    sanitized = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sanitized)
    sys.modules["rayk.storage._records"] = sanitized
    from rayk.storage import records
    from tests.test_compiled_records import assert_same

    assert records._records is sanitized, "the walk under test is the sanitized build"
    inputs = sorted(Path(corpus).iterdir())
    checked = 0
    for path in inputs:
        data = path.read_bytes()
        # each input cut at every length too: where a read past the end would show
        for end in range(2, len(data) + 1):
            assert_same(data[1:end], data[0] % (MAX_RECORD_COUNT + 1))
            checked += 1
    print(f"{len(inputs)} inputs, {checked} sections with their truncations, checked under AddressSanitizer"
          " and UndefinedBehaviorSanitizer: no report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="how long to explore; default 60")
    parser.add_argument("--runs", type=int, help="explore this many inputs instead")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rayk-fuzz-"))
    corpus = work / "corpus"
    corpus.mkdir()
    seeds(corpus)
    limit = f"-runs={args.runs}" if args.runs is not None else f"-max_total_time={args.seconds}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    explored = subprocess.run(
        [sys.executable, "-c", "from tests.fuzz.compiled_records import explore; import sys; explore(sys.argv[1:])",
         limit, "-max_len=4096", "-print_final_stats=1", str(corpus)],
        env=env,
    )
    if explored.returncode != 0:
        raise SystemExit(f"fuzzing the compiled record codec failed (exit {explored.returncode}); see above")
    built = build_sanitized(work / "build")
    checked = subprocess.run(
        [sys.executable, "-c", "from tests.fuzz.compiled_records import check; import sys; check(sys.argv[1])", str(corpus)],
        env={**env, "LD_PRELOAD": sanitizer_runtimes(), ENV_BUILD: str(built),
             # Python's own allocations are never freed at exit: no leak report for them.
             "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"},
    )
    if checked.returncode != 0:
        raise SystemExit(f"the compiled record codec failed under the sanitizers (exit {checked.returncode}); see above")


if __name__ == "__main__":
    main()
