"""The fuzzing harness of the compiled record codec (tests/fuzz/compiled_records.py), run
briefly so that it cannot rot between the long runs of `make fuzz`: both phases, the
exploration by libFuzzer and the check of its corpus under AddressSanitizer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_record_codec_fuzzer_explores_and_checks_its_corpus_under_the_sanitizers(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "tests.fuzz.compiled_records", "--runs", "3000"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "stat::number_of_executed_units: 3000" in done.stderr
    assert "checked under AddressSanitizer and UndefinedBehaviorSanitizer: no report" in done.stdout
