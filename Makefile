# Both targets work on a fresh machine with only Python 3.11 and Java 17: they create .venv
# and install into it, on first use, exactly the dependency tree pinned in uv.lock, with uv
# (fetched from PyPI into .uv; it installs in parallel: ~30 s here on a quiet machine with
# nothing cached, where pip took ~5 min).
# `uv lock` after a change to pyproject.toml's dependencies; `pip install rayk` still works.
PYTHON ?= python3.11
UV_VERSION := 0.13.9
UV := .uv/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXTRAS := --extra test --extra spark --extra docs

.PHONY: test demo bench bytecode clean chaos fuzz fuzz-native docs docs-serve

# uv is one binary: pip puts it in .uv/bin (a venv of its own, where this Python's pip is
# missing, as on Debian without python3-pip).
$(UV):
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target .uv uv==$(UV_VERSION) \
	  || { $(PYTHON) -m venv .uv/venv && .uv/venv/bin/pip install --quiet --target .uv uv==$(UV_VERSION); }

# Everything the targets use: the tests, Spark (rayk's `spark` extra) for the demo's
# pipeline and tests/test_spark.py, and the documentation site's tools. --frozen: the lock
# is installed as it is, never re-resolved; a change to it, to the C sources or to this
# file installs again.
# --compile-bytecode: uv, unlike pip, installs no bytecode, and where PYTHONDONTWRITEBYTECODE
# is set (as on CI's machines) no import ever writes any, so every Ray worker process, and
# every partition replica is one, compiled Ray's and the other dependencies' sources again
# at each start: 1.2 CPU-s of imports per replica instead of 0.4 (benchmarks/bytecode_bench.py),
# and `make test` took 37 minutes instead of 22.
SYNC := $(UV) sync --quiet --frozen --compile-bytecode --python $(PYTHON) $(EXTRAS)
$(STAMP): $(UV) Makefile pyproject.toml uv.lock setup.py rayk/storage/_records.c rayk/storage/_columns.c rayk/storage/_varint.h rayk/storage/_murmur2.h rayk/client/_hand_out.c rayk/client/_send.c native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)
	$(SYNC)
	touch $(STAMP)

# Every partition replica is a Ray worker process that imports rayk: with bytecode compiled
# ahead, none of them compiles rayk's sources again (under PYTHONDONTWRITEBYTECODE each one
# did, ~0.1 CPU-s per replica start; see benchmarks/replication_bench.py, part 3).
bytecode: $(STAMP)
	$(PY) -m compileall -q rayk

# Where cargo is installed, the native crate's own unit tests first (native/src/*.rs).
test: bytecode docs
	if command -v cargo >/dev/null; then (cd native && cargo test --release --quiet); fi
	$(PY) -m mypy
	$(PY) -m pytest -q --durations=30

# Randomized fault schedules (tests/faults/nemesis.py) with seeds SEED, SEED+1, ... for
# MINUTES minutes; a failed seed prints the command that replays it.
# Then ENV_COUNT environment schedules (tests/faults/env_nemesis.py: network, disk and clock
# faults on a netns cluster, needs root) from ENV_SEED, ~5 minutes each; 169-171 draw every
# kind of environment fault between them.
SEED ?= 1
MINUTES ?= 10
ENV_SEED ?= 169
ENV_COUNT ?= 3
chaos: bytecode fuzz
	$(PY) -m pytest -q -m chaos tests
	$(PY) -m tests.faults.chaos --seed $(SEED) --minutes $(MINUTES)
	$(PY) -m tests.faults.env_nemesis --seed $(ENV_SEED) --count $(ENV_COUNT)

# libFuzzer over the compiled record codec, the native code that meets clients' bytes, then
# every input it kept through a build with AddressSanitizer and UBSan (tests/fuzz/).
# Then, where cargo is installed, cargo-fuzz (libFuzzer with AddressSanitizer, on rustup's
# nightly toolchain) over the native produce path's reading of replicas' answers, and the
# native data plane's reading of request frames (an endpoint's) and of answer frames (a
# connection's), a follower's native copy loop's reading of fetch answers, and a
# listener's native Kafka client connections (any client's bytes, cut anywhere, admitted
# now or later: native/fuzz/fuzz_targets/kafka_conns.rs), for FUZZ_NATIVE_SECONDS each.
FUZZ_SECONDS ?= 300
FUZZ_NATIVE_SECONDS ?= 120
CARGO_FUZZ := .cargo-tools/bin/cargo-fuzz
fuzz: bytecode
	$(PY) -m tests.fuzz.compiled_records --seconds $(FUZZ_SECONDS)
	if ! command -v cargo >/dev/null; then echo "no cargo: native/ is not built, nothing to fuzz"; \
	elif ! cargo +nightly --version >/dev/null 2>&1; then echo "no nightly toolchain (rustup toolchain install nightly): native/ not fuzzed"; \
	else $(MAKE) fuzz-native; fi

$(CARGO_FUZZ):
	cargo install cargo-fuzz --version 0.13.2 --locked --quiet --root .cargo-tools

fuzz-native: $(CARGO_FUZZ)
	for target in produce_answer endpoint_frames client_frames follower_answer kafka_conns; do \
	  (cd native && PATH="$(abspath .cargo-tools/bin):$$PATH" cargo +nightly fuzz run $$target -- \
	    -max_total_time=$(FUZZ_NATIVE_SECONDS) -print_final_stats=1) || exit 1; \
	done

# The documentation site, built into site/ with --strict: a broken link, a page missing from
# the navigation or an API reference that does not resolve fails the build.
# (NO_MKDOCS_2_WARNING: Material's notice about its successor, printed on every build.)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# rayk demo's run, then the Spark and work-queue examples, on one local Ray and one cluster
# (examples/demo.py; each also runs alone: `rayk demo`, `python examples/spark_pipeline.py`).
demo: bytecode
	$(PY) examples/demo.py

bench: bytecode
	$(SYNC) --extra bench
	$(PY) benchmarks/storage_bench.py
	$(PY) benchmarks/bytecode_bench.py
	$(PY) benchmarks/client_bench.py
	$(PY) benchmarks/send_gc_bench.py
	$(PY) benchmarks/client_cpu_bench.py
	$(PY) benchmarks/ack_path_bench.py
	$(PY) benchmarks/decode_bench.py
	$(PY) benchmarks/read_path_bench.py
	$(PY) benchmarks/tail_read_bench.py
	$(PY) benchmarks/sendfile_bench.py
	$(PY) benchmarks/page_cache_bench.py
	$(PY) benchmarks/frame_reader_bench.py
	$(PY) benchmarks/ray_call_bench.py
	$(PY) benchmarks/dataplane_turn_bench.py
	$(PY) benchmarks/response_encoding_bench.py
	$(PY) benchmarks/latency_cpu_bench.py
	$(PY) benchmarks/kafka_protocol_bench.py
	$(PY) benchmarks/tail_bench.py
	$(PY) benchmarks/niceness_bench.py
	$(PY) benchmarks/java_client_bench.py
	$(PY) benchmarks/transactions_bench.py
	$(PY) benchmarks/metadata_bench.py
	$(PY) benchmarks/metadata_request_bench.py
	$(PY) benchmarks/share_group_bench.py
	$(PY) benchmarks/capacity_bench.py
	$(PY) benchmarks/tiered_storage_bench.py
	$(PY) benchmarks/plot.py

clean:
	rm -rf $(VENV) .uv site *.egg-info
