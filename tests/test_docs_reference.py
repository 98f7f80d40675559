"""The documentation's reference pages are generated from the code (docs/hooks.py): these
tests hold the generated tables to every broker setting, topic setting, Kafka API and
`rayk` command there is, and the pages to the markers that ask for them. (`make docs`,
part of `make test`, builds the site itself with --strict.)"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re

import pytest

from rayk.cli import build_parser
from rayk.config import REPLICATION_TOPIC_CONFIGS, BrokerConfig, topic_config_defaults, validate_topic_configs
from rayk.net.api_versions import SUPPORTED_VERSIONS
from rayk.storage.log_config import PROPERTY_FIELDS, LogConfig
from tests.readme import DOCS

_spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
assert _spec is not None and _spec.loader is not None
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)


def first_column(table: str) -> list[str]:
    """The first cell of each row of a Markdown table, header and rule left out."""
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    return [row.split(" | ")[0].removeprefix("| ") for row in rows]


def test_the_broker_table_holds_every_broker_setting_with_its_description():
    table = hooks.broker_config_table()
    names = first_column(table)
    docs = hooks.field_docs(BrokerConfig)
    for f in dataclasses.fields(BrokerConfig):
        assert docs.get(f.name), f"BrokerConfig.{f.name} has no docstring for the configuration reference"
    settings = [f.name.replace("_", ".") for f in dataclasses.fields(BrokerConfig) if f.name != "listener_overrides"]
    assert sorted(names) == sorted([f"`{s}`" for s in settings] + ["`listener.name.<listener>.<setting>`"])
    # Every name in the table is one rayk accepts, at its default.
    defaults = BrokerConfig()
    BrokerConfig.from_properties({s: getattr(defaults, s.replace(".", "_")) for s in settings})
    BrokerConfig.from_properties({"listener.name.internal.ssl.client.auth": "none"})


def test_the_topic_table_holds_every_topic_setting_rayk_accepts():
    names = [name.strip("`") for name in first_column(hooks.topic_config_table())]
    accepted = [*PROPERTY_FIELDS, *REPLICATION_TOPIC_CONFIGS]
    assert names == accepted
    defaults = topic_config_defaults(BrokerConfig())
    assert set(names) == set(defaults), "DescribeConfigs lists exactly the topic settings the table holds"
    assert validate_topic_configs(defaults) == defaults, "each is accepted at its default"
    docs = hooks.field_docs(LogConfig)
    assert all(docs.get(field) for field in PROPERTY_FIELDS.values()), "every LogConfig field has a docstring"


def test_the_kafka_api_table_holds_every_api_the_listener_serves_with_its_versions():
    table = hooks.kafka_apis_table()
    assert f"The listener serves {len(SUPPORTED_VERSIONS)} Kafka APIs." in table
    rows = {re.fullmatch(r".* \((\d+)\)", cell).group(1): cell for cell in first_column(table)}  # type: ignore[union-attr]
    assert sorted(map(int, rows)) == sorted(SUPPORTED_VERSIONS)
    for key, (low, high) in SUPPORTED_VERSIONS.items():
        assert f"| {rows[str(key)]} | {low}-{high} |" in table
    assert hooks.api_name(23) == "OffsetForLeaderEpoch" and hooks.api_name(18) == "ApiVersions"
    served = {hooks.api_name(key) for key in SUPPORTED_VERSIONS}
    assert set(hooks.KAFKA_API_NOTES) <= served, "a note for an API the listener does not serve"


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ("rayk",)):
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*words, name))


def test_the_cli_reference_holds_every_command_and_option():
    text = hooks.cli_reference()
    for words, parser in commands(build_parser()):
        assert f"### `{' '.join(words)}`" in text
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in text, f"{' '.join(words)} {option}"


@pytest.mark.parametrize("page, marker", [
    ("reference/configuration.md", "broker-config"),
    ("reference/configuration.md", "topic-config"),
    ("reference/kafka-apis.md", "kafka-apis"),
    ("reference/cli.md", "cli"),
])
def test_each_reference_page_asks_for_its_generated_part(page, marker):
    markdown = (DOCS / page).read_text()
    assert f"<!-- generated: {marker} -->\n" in markdown
    built = hooks.on_page_markdown(markdown)
    assert "<!-- generated:" not in built and hooks.GENERATED[marker]() in built


def test_the_kafka_clients_guide_links_to_the_api_table_instead_of_keeping_one():
    guide = (DOCS / "guides" / "kafka-clients.md").read_text()
    assert "| Produce (0) |" not in guide and "../reference/kafka-apis.md" in guide
