"""Each fault test's producer stops with the test, even when the test fails."""

from __future__ import annotations

import pytest

from tests.faults.harness import abandon_running_traffic


@pytest.fixture(autouse=True)
def stop_traffic():
    yield
    abandon_running_traffic()
