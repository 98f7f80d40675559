"""RAYK_NATIVE: which native paths a process uses (rayk/native_paths.py)."""

from __future__ import annotations

import pytest

from rayk import native_paths
from rayk.errors import InvalidConfigurationError

ALL = frozenset(native_paths.PATHS)


@pytest.mark.parametrize("value", ["", "1", "all", " ALL "])
def test_unset_or_all_turns_every_path_on(value):
    assert native_paths.chosen(value) == ALL


@pytest.mark.parametrize("value", ["0", "none"])
def test_zero_or_none_turns_every_path_off(value):
    assert native_paths.chosen(value) == frozenset()


def test_a_list_turns_on_those_only_and_minus_entries_all_but_those():
    assert native_paths.chosen("listener, client") == {"listener", "client"}
    assert native_paths.chosen("-kafka_conns,-endpoint,-parked_fetch,-parked_produce,-follower") == {"listener", "client"}
    assert native_paths.chosen("-parked_fetch") == ALL - {"parked_fetch"}


@pytest.mark.parametrize("value", ["listener,endpont", "-sendfile", "2"])
def test_a_path_that_does_not_exist_is_invalid_config_naming_the_ones_that_do(value):
    with pytest.raises(InvalidConfigurationError,
                       match="listener, kafka_conns, endpoint, client, parked_fetch, parked_produce, follower"):
        native_paths.chosen(value)


def test_naming_and_excluding_at_once_is_invalid_config():
    with pytest.raises(InvalidConfigurationError, match="one or the other"):
        native_paths.chosen("listener,-parked_fetch")


@pytest.mark.skipif(not native_paths.built(), reason="rayk._native is not built (no cargo)")
def test_the_parked_paths_need_the_native_endpoint(monkeypatch):
    monkeypatch.setenv(native_paths.ENV, "parked_fetch,parked_produce")
    assert not native_paths.enabled("parked_fetch") and not native_paths.enabled("parked_produce")
    monkeypatch.setenv(native_paths.ENV, "endpoint,parked_fetch")
    assert native_paths.enabled("parked_fetch") and native_paths.enabled("endpoint")
    assert not native_paths.enabled("client") and not native_paths.enabled("parked_produce")


@pytest.mark.skipif(not native_paths.built(), reason="rayk._native is not built (no cargo)")
def test_the_native_client_connections_need_the_native_produce_path(monkeypatch):
    monkeypatch.setenv(native_paths.ENV, "kafka_conns")
    assert not native_paths.enabled("kafka_conns")
    monkeypatch.setenv(native_paths.ENV, "-listener")
    assert not native_paths.enabled("kafka_conns")
    monkeypatch.setenv(native_paths.ENV, "listener,kafka_conns")
    assert native_paths.enabled("kafka_conns")


def test_nothing_is_native_where_it_is_not_built(monkeypatch):
    monkeypatch.setattr(native_paths, "_native", None)
    monkeypatch.setenv(native_paths.ENV, "1")
    assert not any(native_paths.enabled(path) for path in native_paths.PATHS)


def test_rayk_start_refuses_a_misspelt_switch_before_it_deploys_anything(monkeypatch):
    import rayk

    monkeypatch.setenv(native_paths.ENV, "listener,endpont")
    with pytest.raises(InvalidConfigurationError, match="endpont"):
        rayk.start(brokers=1, data_dir="/nonexistent/never-made")


def test_a_native_failure_is_an_exception_or_a_panic_never_an_interrupt_or_a_cancellation():
    import asyncio

    class PanicException(BaseException):  # PyO3's, by name: it is not importable from Python
        pass

    assert native_paths.failure(RuntimeError("bug")) and native_paths.failure(PanicException("bug"))
    assert not native_paths.failure(KeyboardInterrupt()) and not native_paths.failure(asyncio.CancelledError())


@pytest.mark.skipif(not native_paths.built(), reason="rayk._native is not built (no cargo)")
def test_a_process_meeting_a_misspelt_switch_logs_it_once_and_uses_the_python_paths(monkeypatch, caplog):
    """A replica of a Ray cluster started with another environment than the driver's: its
    data plane keeps serving, in Python."""
    monkeypatch.setenv(native_paths.ENV, "endpont")
    monkeypatch.setattr(native_paths, "_reported", set())
    with caplog.at_level("ERROR", logger="rayk.native_paths"):
        assert not any(native_paths.enabled(path) for path in native_paths.PATHS)
    assert [r.levelname for r in caplog.records] == ["ERROR"] and "endpont" in caplog.text
