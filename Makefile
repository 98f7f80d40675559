# Both targets work on a fresh machine with only Python 3.11 and Java 17:
# they create .venv and install the pinned dependencies on first use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench bytecode clean chaos

# Everything the targets use: the tests, and Spark (rayk's `spark` extra) for the demo's
# pipeline and tests/test_spark.py. A change to pyproject.toml installs again.
$(STAMP): pyproject.toml setup.py rayk/storage/_records.c rayk/storage/_columns.c rayk/storage/_varint.h
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

# Every partition replica is a Ray worker process that imports rayk: with bytecode compiled
# ahead, none of them compiles rayk's sources again (under PYTHONDONTWRITEBYTECODE each one
# did, ~0.1 CPU-s per replica start; see benchmarks/replication_bench.py, part 3).
bytecode: $(STAMP)
	$(PY) -m compileall -q rayk

test: bytecode
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
chaos: bytecode
	$(PY) -m pytest -q -m chaos tests
	$(PY) -m tests.faults.chaos --seed $(SEED) --minutes $(MINUTES)
	$(PY) -m tests.faults.env_nemesis --seed $(ENV_SEED) --count $(ENV_COUNT)

demo: bytecode
	$(VENV)/bin/rayk demo
	$(PY) examples/spark_pipeline.py
	$(PY) examples/work_queue.py

bench: bytecode
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/storage_bench.py
	$(PY) benchmarks/client_bench.py
	$(PY) benchmarks/send_gc_bench.py
	$(PY) benchmarks/ack_path_bench.py
	$(PY) benchmarks/decode_bench.py
	$(PY) benchmarks/read_path_bench.py
	$(PY) benchmarks/tail_read_bench.py
	$(PY) benchmarks/ray_call_bench.py
	$(PY) benchmarks/dataplane_turn_bench.py
	$(PY) benchmarks/response_encoding_bench.py
	$(PY) benchmarks/latency_cpu_bench.py
	$(PY) benchmarks/kafka_protocol_bench.py
	$(PY) benchmarks/tail_bench.py
	$(PY) benchmarks/java_client_bench.py
	$(PY) benchmarks/transactions_bench.py
	$(PY) benchmarks/metadata_bench.py
	$(PY) benchmarks/share_group_bench.py

clean:
	rm -rf $(VENV) *.egg-info
