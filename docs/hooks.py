"""MkDocs hooks: the reference pages' generated parts (see mkdocs.yml `hooks`).

A page asks for a generated part with a line `<!-- generated: NAME -->`; `on_page_markdown`
replaces it with the Markdown that GENERATED[NAME]() builds from the code, at every build,
so the page cannot drift from the code:

- `broker-config`: BrokerConfig's fields (rayk/config.py), their types, defaults and
  docstrings;
- `topic-config`: the topic configs rayk accepts: LogConfig's (rayk/storage/log_config.py,
  with their docstrings) and config.REPLICATION_TOPIC_CONFIGS, at the defaults
  DescribeConfigs gives;
- `kafka-apis`: the APIs and versions the listener's ApiVersions answer lists
  (rayk/net/admin_apis.py), with the notes of KAFKA_API_NOTES below;
- `cli`: every command of `rayk.cli.build_parser()`, its usage and its options.

tests/test_docs_reference.py calls these functions directly.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import textwrap
from collections.abc import Callable, Iterator

from rayk.cli import build_parser
from rayk.config import LISTENER_SETTINGS, REPLICATION_TOPIC_CONFIGS, BrokerConfig, topic_config_defaults
from rayk.net import api_versions
from rayk.net.admin_apis import api_versions_body
from rayk.storage.log_config import PROPERTY_FIELDS, LogConfig

MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.MULTILINE)

# Units of settings whose name does not end in one (see _unit).
UNITS = {
    "log_cleaner_dedupe_buffer_size": "bytes",
    "sasl_server_max_receive_size": "bytes",
    "metadata_log_max_record_bytes_between_snapshots": "bytes",
}
SUFFIX_UNITS = (("_ms", "ms"), ("_seconds", "s"), ("_minutes", "min"), ("_bytes_per_second", "bytes/s"),
                ("_rate", "bytes/s"), ("_bytes", "bytes"), ("_percentage", "%"))
# Values that mean "no limit" in Kafka's spelling.
NO_LIMIT = {(1 << 63) - 1: "Long.MAX_VALUE: no limit", (1 << 31) - 1: "Integer.MAX_VALUE: no limit"}
TYPES = {"int": "int", "int | None": "long", "bool": "boolean", "str": "string", "float": "double",
         "TimestampType": "string"}

# Each served API next to Apache Kafka 4.1's versions (the `validVersions` of each request
# schema in the kafka-clients 4.1.0 jar), and why rayk's differ. Only the notes are kept
# here; rayk's versions come from the code.
KAFKA_API_NOTES: dict[str, tuple[str, str]] = {
    "Produce": ("3-13", "v13 (new in 4.1) names topics by id (KIP-516): not yet"),
    "Fetch": ("4-18", "v18 (new in 4.1, KIP-1166): not yet"),
    "ListOffsets": ("1-10", "v7-10 look up the max timestamp (KIP-734) and tiered-storage offsets (KIP-405, "
                            "1005, 1075): rayk has no tiered storage, and no max-timestamp lookup yet"),
    "Metadata": ("0-13", "v13 adds a top-level error code (REBOOTSTRAP_REQUIRED, KIP-1102): not yet"),
    "OffsetCommit": ("2-10", "v10 (topic ids) is unstable in 4.1: Kafka does not offer it either"),
    "OffsetFetch": ("1-10", "the same"),
    "FindCoordinator": ("0-6", ""),
    "JoinGroup": ("0-9", ""),
    "Heartbeat": ("0-4", ""),
    "LeaveGroup": ("0-5", ""),
    "SyncGroup": ("0-5", ""),
    "DescribeGroups": ("0-6", ""),
    "ListGroups": ("0-5", ""),
    "SaslHandshake": ("0-1", ""),
    "ApiVersions": ("0-4", ""),
    "CreateTopics": ("2-7", ""),
    "DeleteTopics": ("1-6", "v6 deletes topics by id: not yet"),
    "DeleteRecords": ("0-2", ""),
    "InitProducerId": ("0-6", "v6 (two-phase commit, KIP-939) is unstable in 4.1"),
    "AddPartitionsToTxn": ("0-5", "v4+ is brokers' own; v5 (KIP-890 part 2) is how a Kafka broker asks a "
                                  "coordinator to add a partition, which rayk's leaders do over Ray"),
    "AddOffsetsToTxn": ("0-4", ""),
    "EndTxn": ("0-5", "v5: transaction version 2 (an epoch bump at every end)"),
    "TxnOffsetCommit": ("0-5", "v5: transaction version 2 (adds the offsets partition itself)"),
    "OffsetForLeaderEpoch": ("2-4", ""),
    "DescribeAcls": ("1-3", ""),
    "CreateAcls": ("1-3", ""),
    "DeleteAcls": ("1-3", ""),
    "DescribeConfigs": ("1-4", ""),
    "AlterConfigs": ("0-2", ""),
    "DescribeLogDirs": ("1-4", "a broker's one data directory; KAFKA_STORAGE_ERROR while its disk fails"),
    "SaslAuthenticate": ("0-2", ""),
    "CreatePartitions": ("0-3", ""),
    "DeleteGroups": ("0-2", ""),
    "ElectLeaders": ("0-2", ""),
    "IncrementalAlterConfigs": ("0-1", ""),
    "AlterPartitionReassignments": ("0-1", "v1 (new in 4.1, KIP-860) may refuse a change of replication "
                                           "factor: not yet"),
    "ListPartitionReassignments": ("0-0", ""),
    "OffsetDelete": ("0-0", ""),
    "DescribeClientQuotas": ("0-1", ""),
    "AlterClientQuotas": ("0-1", ""),
    "DescribeUserScramCredentials": ("0-0", ""),
    "AlterUserScramCredentials": ("0-0", ""),
    "DescribeCluster": ("0-2", "v2 lists fenced brokers too (KIP-1073): not yet"),
    "DescribeProducers": ("0-0", ""),
    "DescribeTransactions": ("0-0", ""),
    "ListTransactions": ("0-2", "v2 (new in 4.1, KIP-1152) filters ids by a pattern: not yet"),
    "ConsumerGroupHeartbeat": ("0-1", ""),
    "ConsumerGroupDescribe": ("0-1", ""),
    "ShareGroupHeartbeat": ("1-1", ""),
    "ShareGroupDescribe": ("1-1", ""),
    "ShareFetch": ("1-1", "(v2, new in 4.2, renews acquisition locks, KIP-1222: not yet)"),
    "ShareAcknowledge": ("1-1", "(the same)"),
    "DescribeShareGroupOffsets": ("0-0", "(v1, new in 4.2, adds each partition's lag: not yet)"),
    "AlterShareGroupOffsets": ("0-0", ""),
    "DeleteShareGroupOffsets": ("0-0", ""),
}


def on_page_markdown(markdown: str, **_kwargs: object) -> str:
    return MARKER.sub(lambda m: GENERATED[m.group(1)](), markdown)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (the string right after it), whitespace
    joined; Python keeps them in the source only."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))  # type: ignore[arg-type]
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__).body
    return {
        field.target.id: " ".join(doc.value.value.split())
        for field, doc in zip(body, body[1:])
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
        and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
    }


def broker_config_table() -> str:
    """Every BrokerConfig field by its Kafka name, with its type, default and docstring."""
    docs = field_docs(BrokerConfig)
    rows = []
    for f in dataclasses.fields(BrokerConfig):
        if f.name == "listener_overrides":
            name, kind, default = "listener.name.<listener>.<setting>", "string", "none"
            doc = f"{docs[f.name]} Settings: {', '.join(f'`{s}`' for s in LISTENER_SETTINGS)}."
        else:
            name, kind, doc = f.name.replace("_", "."), TYPES[str(f.type)], docs[f.name]
            default = _default(f.default, _unit(f.name))
        rows.append((f"`{name}`", kind, default, _text(doc)))
    return _table(("Setting", "Type", "Default", "Description"), rows)


def topic_config_table() -> str:
    """Every topic config rayk accepts, with its type, default (as DescribeConfigs gives it
    on a broker with default settings) and what it does."""
    defaults = topic_config_defaults(BrokerConfig())
    types = {f.name: str(f.type) for f in dataclasses.fields(LogConfig)}
    docs = field_docs(LogConfig)
    rows = []
    for name, field in PROPERTY_FIELDS.items():
        value = defaults[name]
        default = _default(int(value), _unit(field)) if value.lstrip("-").isdigit() else f"`{value}`"
        rows.append((f"`{name}`", TYPES[types[field]], default, _text(docs[field])))
    broker_types = {f.name: str(f.type) for f in dataclasses.fields(BrokerConfig)}
    for name, doc in REPLICATION_TOPIC_CONFIGS.items():
        kind = TYPES[broker_types[name.replace(".", "_")]]
        rows.append((f"`{name}`", kind, f"the broker's `{name}` (`{defaults[name]}`)", _text(doc)))
    return _table(("Setting", "Type", "Default", "Description"), rows)


def kafka_apis_table() -> str:
    """The APIs and version ranges that ApiVersions answers, by name and key, next to Kafka
    4.1's and the notes of KAFKA_API_NOTES."""
    keys = api_versions_body()["api_keys"]
    rows = []
    for key in keys:
        name = api_name(key["api_key"])
        kafka, note = KAFKA_API_NOTES.get(name, ("", ""))
        rows.append((f"{name} ({key['api_key']})", f"{key['min_version']}-{key['max_version']}", kafka, _text(note)))
    count = f"The listener serves {len(keys)} Kafka APIs.\n\n"
    return count + _table(("API (key)", "rayk", "Kafka 4.1", "difference, and why"), rows)


def api_name(api_key: int) -> str:
    """Kafka's name of an API (`OffsetForLeaderEpoch`), from the constant that keys it in
    SUPPORTED_VERSIONS of rayk/net/api_versions.py (`OFFSET_FOR_LEADER_EPOCH`)."""
    tree = ast.parse(inspect.getsource(api_versions))
    table = next(n.value for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                 and n.target.id == "SUPPORTED_VERSIONS")
    assert isinstance(table, ast.Dict)
    constant = next(k.id for k in table.keys if isinstance(k, ast.Name) and getattr(api_versions, k.id) == api_key)
    return "".join(word.capitalize() for word in constant.split("_"))


def cli_reference() -> str:
    """Every command and subcommand of `rayk`: a heading, what it does, its usage and a
    table of its arguments and options (-h/--help, which every one has, left out)."""
    parts = []
    for words, parser, summary in _commands(build_parser(), ("rayk",), ""):
        usage = " ".join(parser.format_usage().removeprefix("usage: ").split())
        usage = textwrap.fill(usage, 88, subsequent_indent=" " * (len(parser.prog) + 1), break_on_hyphens=False)
        parts.append(f"### `{' '.join(words)}`\n\n{_text(summary)}\n\n```text\n{usage}\n```\n")
        rows = [(_argument(a), _text(a.help or "")) for a in parser._actions
                if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction)) and a.help != argparse.SUPPRESS]
        if rows:
            parts.append(_table(("Argument", "Description"), rows) + "\n")
    return "\n".join(parts)


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...],
              summary: str) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """(words, parser, summary) of `parser` and of every subcommand under it, depth first;
    a subcommand's summary is the help its parent lists it with."""
    yield words, parser, summary or parser.description or ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield from _commands(sub, (*words, name), helps.get(name, ""))


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    value = ""
    if action.nargs != 0:
        metavar = action.metavar or action.dest.upper()
        value = f" {metavar}" + (" ..." if action.nargs in ("+", "*") else "")
    text = ", ".join(f"`{option}{value}`" for option in action.option_strings)
    return text + (" (required)" if action.required else "")


def _unit(field_name: str) -> str:
    return UNITS.get(field_name) or next((unit for suffix, unit in SUFFIX_UNITS if field_name.endswith(suffix)), "")


def _default(value: object, unit: str) -> str:
    """A default as it is written in a config (`9000`), with its unit and, where that reads
    better, the same in larger units (`9000` ms (9 s))."""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if not isinstance(value, int) or value <= 0:
        return f"`{value}`"
    if value in NO_LIMIT:
        return f"`{value}` ({NO_LIMIT[value]})"
    text = f"`{value}`" + (f" {unit.removesuffix('s') if value == 1 else unit}" if unit else "")
    larger = _larger(value, unit)
    return f"{text} ({larger})" if larger else text


def _larger(value: int, unit: str) -> str:
    """9000 ms as "9 s", 1048576 bytes as "1 MiB"; "" when no larger unit divides it."""
    scales = {"ms": ((86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1000, "s")),
              "s": ((86_400, "d"), (3600, "h"), (60, "min")), "min": ((1440, "d"), (60, "h")),
              "bytes": ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))}.get(unit, ())
    return next((f"{value // size} {name}" for size, name in scales if value >= size and value % size == 0), "")


def _text(text: str) -> str:
    """Prose for a table cell: pipes escaped, and `<`, `__` kept from being read as HTML
    or emphasis."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace("__", "\\_\\_")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


GENERATED: dict[str, Callable[[], str]] = {
    "broker-config": broker_config_table,
    "topic-config": topic_config_table,
    "kafka-apis": kafka_apis_table,
    "cli": cli_reference,
}
