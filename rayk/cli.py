"""`rayk`: the command line of rayk (installed as the `rayk` console script).

    rayk start --brokers 3 --data-dir ./rayk-data      deploy onto the running Ray cluster
    rayk status | rayk stop
    rayk topics create|list|describe|alter|delete ...
    rayk topics delete-records TOPIC --offset N [--partition P]   log start moves to N (-1: the HW)
    rayk topics reassign TOPIC --partition 0 --replicas 3,1,2 | --cancel
    rayk topics reassignments [TOPIC]                  partition moves under way
    rayk groups list | rayk groups describe GROUP
    rayk groups delete-offsets GROUP TOPIC [--partition P]   a topic's committed offsets go
    rayk produce TOPIC < lines                         each line a record
    rayk consume TOPIC --from-beginning               one value per line
    rayk perf produce ... | rayk perf consume ...      Kafka-style perf tests (rayk.perf)
    rayk demo                                          a self-contained end-to-end run

Every command but `demo` attaches to a Ray cluster (`--address`, default "auto": the one
running on this machine) and to the rayk cluster in one Ray namespace (`--namespace`,
default "rayk"). A user mistake (an unknown topic, no cluster, a broker-side error) is
reported as one line, `rayk: error: ...`, with exit code 1; bad options exit 2.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import rayk
from rayk.errors import KafkaError
from rayk.ray_settings import ray_system_config_in_env

PROG = "rayk"
DEFAULT_NAMESPACE = "rayk"
KAFKA_BUFFER_MEMORY = 32 * 1024 * 1024  # the perf producer's default bound on unacknowledged bytes
# The Producer's DEFAULT_BATCH_SIZE and DEFAULT_LINGER_MS (importing them would load Ray
# into every CLI start; tests/test_cli.py holds them equal).
PERF_BATCH_SIZE = 1_048_576
PERF_LINGER_MS = 5
NO_RAY_CLUSTER = "no Ray cluster is running; start one with `ray start --head` or pass --address"


class CliError(Exception):
    """A mistake the user can fix: reported as one line, exit code 1."""


# ---------------------------------------------------------------------------- output helpers


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces."""
    cells = [list(map(str, headers))] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells)


def say(args: argparse.Namespace, *blocks: str) -> None:
    """Prints a command's result, blocks separated by blank lines, on its stdout (see `main`)."""
    print("\n\n".join(blocks), file=args.out, flush=True)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _error_message(error: BaseException) -> str:
    """One line: a KafkaError raised in an actor comes wrapped in a RayTaskError whose
    str() is the remote traceback; its `cause` is the error itself."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        error = cause
    return " ".join(str(error).split()) or type(error).__name__


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _deletion_offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < -1:
        raise argparse.ArgumentTypeError(f"expected an offset >= 0, or -1 for the high watermark, got {value}")
    return value


def _broker_list(text: str) -> list[int]:
    """"3,1,2" -> [3, 1, 2]: broker ids, the first the preferred leader."""
    try:
        return [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated broker ids such as 3,1,2, got {text!r}") from None


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, value


# ---------------------------------------------------------------------------- Ray and rayk


def _init_ray(address: str, namespace: str) -> None:
    """Connects this process to the Ray cluster at `address` ("auto": the local one), quietly.
    A process already connected to Ray (`main()` called from a notebook, say) keeps its
    connection: the commands name their Ray namespace themselves."""
    import ray

    global _connected_here
    _connected_here = not ray.is_initialized()
    if not _connected_here:
        return
    try:
        with ray_system_config_in_env():  # `--address local` starts a Ray: brokers at a server's priority
            ray.init(address=address, namespace=namespace, logging_level=logging.ERROR, log_to_driver=False)
    except ConnectionError:
        if address == "auto" and not os.environ.get("RAY_ADDRESS"):
            raise CliError(NO_RAY_CLUSTER) from None
        hint = ""
        if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            hint = " (if it uses token authentication, set RAY_AUTH_MODE=token)"
        address = os.environ.get("RAY_ADDRESS") or address
        raise CliError(f"cannot connect to the Ray cluster at {address}{hint}") from None


def _connect(args: argparse.Namespace) -> Any:
    """The rayk cluster of `--namespace` on the Ray cluster of `--address`."""
    import rayk

    _init_ray(args.address, args.namespace)
    return rayk.connect(namespace=args.namespace)


_connected_here = False  # whether this process's Ray connection is the CLI's own


def _shutdown_ray() -> None:
    """Disconnects from Ray if the command connected (and not a caller's connection)."""
    global _connected_here
    ray = sys.modules.get("ray")
    if _connected_here and ray is not None and ray.is_initialized():
        ray.shutdown()
    _connected_here = False


def _nodes() -> dict[str, dict]:
    """Alive Ray nodes by node id."""
    import ray

    return {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}


def _brokers_table(cluster: Any) -> str:
    addresses = {node_id: n["NodeManagerAddress"] for node_id, n in _nodes().items()}
    rows = [
        (b["broker_id"], b["node_id"][:12], addresses.get(b["node_id"]), _listener(b), b["fenced"], b["connected"],
         b["decommissioning"])
        for b in cluster.brokers()
    ]
    return table(("broker", "node", "address", "kafka listeners", "fenced", "connected", "leaving"), rows)


def _listener(broker: dict) -> str:
    return ",".join(f"{name}://{host}:{port}" for name, (host, port) in broker["endpoints"].items()) or "-"


def _bootstrap_line(cluster: Any) -> str:
    """bootstrap.servers of the first listener, then one line per other listener."""
    brokers = cluster.brokers()
    names = list(dict.fromkeys(name for b in brokers for name in b["endpoints"]))
    if not names:
        return "no Kafka listeners (listeners is empty)"
    lines = [f"bootstrap.servers={cluster.bootstrap_servers_for(names[0])}"]
    lines += [f"  on {name}: bootstrap.servers={cluster.bootstrap_servers_for(name)}" for name in names[1:]]
    return "\n".join(lines)


def _nodes_table(cluster: Any) -> str:
    per_node: dict[str, list[int]] = {}
    for b in cluster.brokers():
        per_node.setdefault(b["node_id"], []).append(b["broker_id"])
    rows = [
        (node_id[:12], n["NodeManagerAddress"], int(n["Resources"].get("CPU", 0)), per_node.get(node_id, []))
        for node_id, n in sorted(_nodes().items())
    ]
    return table(("node", "address", "cpus", "brokers"), rows)


# ---------------------------------------------------------------------------- start, status, stop


def cmd_start(args: argparse.Namespace) -> None:
    import rayk

    _init_ray(args.address, args.namespace)
    if args.wait_for_nodes_s and not args.autoscale:  # with --autoscale, rayk.start asks for the nodes and waits
        _wait_for_broker_nodes(args.brokers, args.node_resource, args.wait_for_nodes_s)
    cluster = rayk.start(
        brokers=args.brokers, data_dir=args.data_dir, config=dict(args.config), namespace=args.namespace,
        node_resource=args.node_resource, autoscale=args.autoscale,
    )
    data_dir = Path(args.data_dir).resolve()
    size = f"at least {args.brokers} brokers, following Ray's autoscaler," if args.autoscale else f"{args.brokers} brokers"
    started = f"rayk cluster of {size} started in Ray namespace {args.namespace!r}"
    say(args, f"{started}, data in {data_dir}", _brokers_table(cluster), _nodes_table(cluster), _bootstrap_line(cluster))


def _wait_for_broker_nodes(brokers: int, node_resource: str | None, timeout_s: float) -> None:
    """Waits until `brokers` alive Ray nodes (offering `node_resource`, if given) have joined:
    `ray up` starts the head's commands before any worker exists."""
    import ray

    def ready() -> int:
        return sum(
            1 for n in ray.nodes()
            if n["Alive"] and (node_resource is None or n["Resources"].get(node_resource, 0) > 0)
        )  # fmt: skip

    deadline = time.monotonic() + timeout_s
    while (count := ready()) < brokers:
        if time.monotonic() > deadline:
            what = f"offering {node_resource!r}" if node_resource else "alive"
            raise CliError(f"only {count} Ray nodes {what} after {timeout_s:.0f} s; {brokers} brokers need {brokers}")
        time.sleep(1)


def cmd_status(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    names = cluster.admin().list_topics(include_internal=True)
    descriptions = {t: cluster.describe_topic(t) for t in names}
    topics = [
        (t, len(parts), len(parts[0]["replicas"]) if parts else 0, sum(_under_replicated(p) for p in parts))
        for t, parts in descriptions.items()
        if not t.startswith("__")
    ]
    lagging = [_partition_row(p)[:5] for parts in descriptions.values() for p in parts if _under_replicated(p)]
    say(
        args,
        f"rayk cluster in Ray namespace {args.namespace!r}",
        _brokers_table(cluster),
        _bootstrap_line(cluster),
        table(("topic", "partitions", "replication", "under-replicated"), topics) if topics else "no topics",
        "under-replicated partitions: none"
        if not lagging
        else "under-replicated partitions:\n" + table(("topic", "partition", "leader", "replicas", "isr"), lagging),
        _health_block(cluster.health()),
    )


def _health_block(health: dict[str, Any]) -> str:
    """Kafka's health metrics as the actors report them (what Prometheus scrapes, too)."""
    rows = [
        (b, None, None, None, None) if h is None
        else (b, h.leader_count, h.partition_count, h.under_replicated_partitions, h.under_min_isr_partition_count)
        for b, h in health["brokers"].items()
    ]
    return (
        f"active controllers: {health['active_controller_count']}; "
        f"offline partitions: {health['offline_partitions_count']}\n"
        + table(("broker", "leaders", "partitions", "under-replicated", "under-min-isr"), rows)
    )


def _under_replicated(partition: dict) -> bool:
    return len(partition["isr"]) < len(partition["replicas"])


def cmd_stop(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    data_dir = cluster.data_dir()
    cluster.shutdown()
    say(args, f"rayk cluster in Ray namespace {args.namespace!r} stopped; its data stays in {data_dir}")


# ---------------------------------------------------------------------------- brokers


def cmd_brokers_list(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    held: dict[int, int] = {}
    leading: dict[int, int] = {}
    for name in cluster.list_topics(include_internal=True):
        for p in cluster.describe_topic(name):
            for b in p["replicas"]:
                held[b] = held.get(b, 0) + 1
            leading[p["leader"]] = leading.get(p["leader"], 0) + 1
    rows = [(b["broker_id"], b["node_id"][:12], _listener(b), held.get(b["broker_id"], 0),
             leading.get(b["broker_id"], 0), _broker_state(b)) for b in cluster.brokers()]  # fmt: skip
    say(args, table(("broker", "node", "kafka listeners", "replicas", "leaders", "state"), rows))


def _broker_state(broker: dict) -> str:
    if broker["decommissioning"]:
        return "leaving"
    return "fenced" if broker["fenced"] else "live" if broker["connected"] else "away"


def cmd_brokers_add(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    broker_id = cluster.add_broker(args.node_id)
    say(args, f"broker {broker_id} added; the balancer gives it its share of the partitions", _brokers_table(cluster))


def cmd_brokers_remove(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    cluster.remove_broker(args.broker_id, timeout_ms=int(args.timeout_s * 1000))
    say(args, f"broker {args.broker_id} decommissioned: its replicas moved to the other brokers, and it left",
        _brokers_table(cluster))


# ---------------------------------------------------------------------------- topics


def cmd_topics_create(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    created = cluster.admin().create_topic(
        args.name, args.partitions, args.replication_factor, dict(args.config) or None
    )  # a count left out (None) takes the brokers' num.partitions / default.replication.factor
    say(args, f"created topic {args.name!r}: {len(created)} partitions, replication factor {len(created[0]['replicas'])}")


def cmd_topics_list(args: argparse.Namespace) -> None:
    names = _connect(args).admin().list_topics()
    if names:
        say(args, "\n".join(names))


def cmd_topics_describe(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    partitions = cluster.describe_topic(args.name)
    configs = cluster.admin().describe_topic_configs(args.name)
    replication = len(partitions[0]["replicas"]) if partitions else 0
    topic_id = partitions[0]["topic_id"] if partitions else "-"
    summary = (
        f"topic {args.name}  id {topic_id}  partitions {len(partitions)}  "
        f"replication factor {replication}  configs {_configs_text(configs)}"
    )
    say(args, summary + "\n" + table(PARTITION_COLUMNS, [_partition_row(p) for p in partitions]))


PARTITION_COLUMNS = ("topic", "partition", "leader", "replicas", "isr", "leader epoch", "log start", "high watermark",
                     "log end")  # fmt: skip


def _partition_row(p: dict) -> tuple:
    return (
        p["topic"], p["partition"], p["leader"], p["replicas"], p["isr"],
        p["leader_epoch"], p["log_start_offset"], p["high_watermark"], p["log_end_offset"],
    )  # fmt: skip


def _configs_text(configs: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(configs.items())) or "(broker defaults)"


def cmd_topics_alter(args: argparse.Namespace) -> None:
    if not args.config and args.partitions is None:
        raise CliError("topics alter needs --partitions N, --config KEY=VALUE, or both")
    admin = _connect(args).admin()
    if args.partitions is not None:
        partitions = admin.create_partitions({args.name: args.partitions})[args.name]
        say(args, f"topic {args.name!r} has {len(partitions)} partitions")
    if args.config:
        configs = admin.alter_topic_configs(args.name, dict(args.config))
        say(args, f"topic {args.name!r} configs: {_configs_text(configs)}")


def cmd_topics_delete(args: argparse.Namespace) -> None:
    _connect(args).admin().delete_topics([args.name])
    say(args, f"deleted topic {args.name!r}")


def cmd_topics_delete_records(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    partitions = [args.partition] if args.partition is not None else [p["partition"] for p in cluster.describe_topic(args.name)]
    low_watermarks = cluster.admin().delete_records({(args.name, p): args.offset for p in partitions})
    rows = sorted((tp.topic, tp.partition, low) for tp, low in low_watermarks.items())
    say(args, table(("topic", "partition", "log start"), rows))


def cmd_topics_reassign(args: argparse.Namespace) -> None:
    from rayk.client.types import TopicPartition

    cluster = _connect(args)
    admin = cluster.admin()
    tp = TopicPartition(args.name, args.partition)
    error = admin.alter_partition_reassignments({tp: None if args.cancel else args.replicas})[tp]
    if error is not None:
        raise error
    name = f"{tp.topic}-{tp.partition}"
    if args.cancel:
        replicas = next(p["replicas"] for p in cluster.describe_topic(tp.topic) if p["partition"] == tp.partition)
        say(args, f"cancelled the reassignment of {name}; its replicas are {_ids(replicas)}")
        return
    ongoing = admin.list_partition_reassignments([tp]).get(tp)
    if ongoing is None:  # nothing to copy: the target was the current replicas, or fewer of them
        say(args, f"{name} has replicas {_ids(args.replicas)}")
    else:
        say(args, f"reassigning {name} to replicas {_ids(args.replicas)}: adding {_ids(ongoing.adding_replicas)}, "
                  f"removing {_ids(ongoing.removing_replicas)}; `rayk topics reassignments` shows the progress")  # fmt: skip


def cmd_topics_reassignments(args: argparse.Namespace) -> None:
    from rayk.client.types import TopicPartition

    cluster = _connect(args)
    partitions = None
    if args.name is not None:  # an unknown topic is an error here, not an empty list
        partitions = [TopicPartition(args.name, p["partition"]) for p in cluster.describe_topic(args.name)]
    ongoing = cluster.admin().list_partition_reassignments(partitions)
    if not ongoing:
        say(args, "no partition reassignments in progress" + (f" for topic {args.name!r}" if args.name else ""))
        return
    rows = [
        (tp.topic, tp.partition, _ids(r.replicas), _ids(r.adding_replicas), _ids(r.removing_replicas))
        for tp, r in ongoing.items()
    ]
    say(args, table(("topic", "partition", "replicas", "adding", "removing"), rows))


def cmd_topics_elect_leaders(args: argparse.Namespace) -> None:
    from rayk.client.types import TopicPartition

    if args.partition is not None and args.name is None:
        raise CliError("--partition needs a topic name")
    cluster = _connect(args)
    partitions = None
    if args.name is not None:
        numbers = [args.partition] if args.partition is not None else [p["partition"] for p in cluster.describe_topic(args.name)]
        partitions = [TopicPartition(args.name, n) for n in numbers]
    results = cluster.admin().elect_leaders(partitions, args.type)
    if not results:
        say(args, "every partition is led by its preferred replica")
        return
    leaders = {}
    for topic in sorted({tp.topic for tp in results}):
        leaders.update({(topic, p["partition"]): p["leader"] for p in cluster.describe_topic(topic)})
    rows = [(tp.topic, tp.partition, leaders.get(tp, "-"), "elected" if e is None else e.name) for tp, e in results.items()]
    say(args, table(("topic", "partition", "leader", "result"), rows))


def _ids(broker_ids: Sequence[int]) -> str:
    return ",".join(map(str, broker_ids)) or "-"


# ---------------------------------------------------------------------------- groups


def cmd_groups_list(args: argparse.Namespace) -> None:
    groups = _connect(args).admin().list_consumer_groups()
    if groups:
        say(args, table(("group", "state"), [(g["group_id"], g["state"]) for g in groups]))


def cmd_groups_delete(args: argparse.Namespace) -> None:
    (error,) = _connect(args).admin().delete_consumer_groups([args.group]).values()
    if error is not None:
        raise error
    say(args, f"deleted group {args.group} and its committed offsets")


def cmd_groups_delete_offsets(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    partitions = [args.partition] if args.partition is not None else [p["partition"] for p in cluster.describe_topic(args.topic)]
    results = cluster.admin().delete_consumer_group_offsets(args.group, [(args.topic, p) for p in partitions])
    rows = sorted((tp.topic, tp.partition, "deleted" if error is None else error.name) for tp, error in results.items())
    say(args, table(("topic", "partition", "result"), rows))


def cmd_groups_describe(args: argparse.Namespace) -> None:
    from rayk.consumer_protocol import decode_assignment

    info = _connect(args).admin().describe_consumer_groups([args.group])[args.group]  # GROUP_ID_NOT_FOUND if unknown
    owners = {}
    members = []
    for m in info["members"]:
        assigned = decode_assignment(m["assignment"]).partitions if m["assignment"] else {}
        owners.update({(t, p): m["member_id"] for t, ps in assigned.items() for p in ps})
        assignment = " ".join(f"{t}:{_cell(sorted(ps))}" for t, ps in assigned.items())
        members.append((m["member_id"], m["client_id"], assignment))
    offsets = [
        (tp.topic, tp.partition, o["committed"], o["end_offset"], o["lag"], owners.get((tp.topic, tp.partition)))
        for tp, o in info["partitions"].items()
    ]
    blocks = [f"group {args.group}  state {info['state']}  generation {info['generation']}  members {len(members)}"]
    if members:
        blocks.append(table(("member", "client", "assignment"), members))
    blocks.append(table(("topic", "partition", "committed", "end offset", "lag", "member"), offsets))
    say(args, *blocks)


# ---------------------------------------------------------------------------- ACLs


def _acl_resource(args: argparse.Namespace) -> tuple[int, str | None]:
    from rayk import acls

    if args.cluster:
        return acls.CLUSTER, acls.CLUSTER_NAME
    for option, resource_type in (("topic", acls.TOPIC), ("group", acls.GROUP), ("transactional_id", acls.TRANSACTIONAL_ID)):
        if getattr(args, option) is not None:
            return resource_type, getattr(args, option)
    return acls.ANY, None


def _acl_bindings(args: argparse.Namespace) -> list:
    from rayk import acls

    resource_type, name = _acl_resource(args)
    if name is None:
        raise CliError("name a resource: --topic, --group, --transactional-id or --cluster")
    pattern = acls.PATTERN_TYPES[args.resource_pattern_type or "literal"]
    who = [(p, acls.ALLOW) for p in args.allow_principal] + [(p, acls.DENY) for p in args.deny_principal]
    if not who or not args.operation:
        raise CliError("give --allow-principal or --deny-principal, and --operation")
    return [acls.AclBinding(resource_type, name, pattern, principal, args.host, acls.OPERATIONS[op], permission)
            for principal, permission in who for op in args.operation]


def _acl_filter(args: argparse.Namespace, removing: bool = False) -> Any:
    """The filter of `list` or `remove`. Removing, as kafka-acls does, needs a resource or
    a principal (never every ACL by default), and a named resource means its literal
    pattern unless --resource-pattern-type says otherwise."""
    from rayk import acls

    resource_type, name = _acl_resource(args)
    if removing and name is None and args.principal is None:
        raise CliError("name what to remove: --topic, --group, --transactional-id, --cluster or --principal")
    default = acls.LITERAL if removing and name is not None else acls.ANY
    pattern = acls.PATTERN_TYPES[args.resource_pattern_type] if args.resource_pattern_type else default
    return acls.AclFilter(resource_type, name, pattern, args.principal)


def _acl_rows(bindings: Iterable[Any]) -> list[tuple]:
    from rayk import acls

    names = {kind: {v: k for k, v in table_.items()} for kind, table_ in (
        ("resource", acls.RESOURCE_TYPES), ("pattern", acls.PATTERN_TYPES), ("operation", acls.OPERATIONS),
        ("permission", acls.PERMISSIONS))}
    return [(b.principal, names["permission"][b.permission_type], names["operation"][b.operation], b.host,
             names["resource"][b.resource_type], b.resource_name, names["pattern"][b.pattern_type]) for b in bindings]


ACL_COLUMNS = ("principal", "permission", "operation", "host", "resource", "name", "pattern")


def cmd_acls_add(args: argparse.Namespace) -> None:
    bindings = _acl_bindings(args)
    for error in _connect(args).admin().create_acls(bindings):
        if error is not None:
            raise error
    say(args, table(ACL_COLUMNS, _acl_rows(bindings)))


def cmd_acls_list(args: argparse.Namespace) -> None:
    found = _connect(args).admin().describe_acls(_acl_filter(args))
    if found:
        say(args, table(ACL_COLUMNS, _acl_rows(found)))


def cmd_acls_remove(args: argparse.Namespace) -> None:
    (removed,) = _connect(args).admin().delete_acls([_acl_filter(args, removing=True)])
    say(args, f"removed {len(removed)} ACL(s)", *([table(ACL_COLUMNS, _acl_rows(removed))] if removed else []))


# ---------------------------------------------------------------------------- users (SCRAM credentials)


def _password(args: argparse.Namespace) -> str:
    """The password, asked for on a terminal, else the first line of stdin: never an
    argument, which the shell's history and `ps` would keep."""
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass(f"password for {args.user}: ")
    password = sys.stdin.readline().rstrip("\n")
    if not password:
        raise CliError("no password on stdin")
    return password


def _raise_refusals(results: dict[str, KafkaError | None]) -> None:
    for error in results.values():
        if error is not None:
            raise error


def cmd_users_set(args: argparse.Namespace) -> None:
    from rayk.client.admin import ScramUpsertion

    password = _password(args)
    admin = _connect(args).admin()
    _raise_refusals(admin.alter_user_scram_credentials([ScramUpsertion(args.user, args.mechanism, password, args.iterations)]))
    say(args, f"set {args.mechanism} credential of user {args.user} ({args.iterations} iterations)")


def cmd_users_delete(args: argparse.Namespace) -> None:
    from rayk.client.admin import ScramDeletion

    _raise_refusals(_connect(args).admin().alter_user_scram_credentials([ScramDeletion(args.user, args.mechanism)]))
    say(args, f"deleted {args.mechanism} credential of user {args.user}")


def cmd_users_list(args: argparse.Namespace) -> None:
    described = _connect(args).admin().describe_user_scram_credentials(args.users or None)
    rows = [(user, mechanism, iterations) for user, infos in described.items() for mechanism, iterations in infos]
    if rows:
        say(args, table(("user", "mechanism", "iterations"), rows))


# ---------------------------------------------------------------------------- client quotas


def _quota_entity(args: argparse.Namespace, required: bool = True) -> Any:
    """The entity the --user / --client-id options name (kafka-configs' --entity-default
    is --user-default / --client-id-default); None for none when not `required`."""
    from rayk.quotas import DEFAULT, QuotaEntity

    user = DEFAULT if args.user_default else args.user
    client_id = DEFAULT if args.client_id_default else args.client_id
    if user is None and client_id is None:
        if required:
            raise CliError("name a user (--user / --user-default), a client id (--client-id / --client-id-default) or both")
        return None
    return QuotaEntity(user, client_id)


def _quota_cell(name: Any) -> str:
    from rayk.quotas import DEFAULT

    return "" if name is None else "<default>" if name is DEFAULT else name


def _quota_number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def _alter_quotas(args: argparse.Namespace, ops: dict[str, float | None]) -> None:
    entity = _quota_entity(args)
    (error,) = _connect(args).admin().alter_client_quotas({entity: ops}).values()
    if error is not None:
        raise error


def cmd_quotas_set(args: argparse.Namespace) -> None:
    ops: dict[str, float | None] = {}
    for key, value in args.quotas:
        try:
            ops[key] = float(value)
        except ValueError:
            raise CliError(f"{key}={value}: the value is a number") from None
    _alter_quotas(args, ops)
    say(args, f"set {', '.join(f'{k}={_quota_number(v)}' for k, v in ops.items() if v is not None)} for {_quota_entity(args)}")


def cmd_quotas_delete(args: argparse.Namespace) -> None:
    _alter_quotas(args, dict.fromkeys(args.keys))
    say(args, f"deleted {', '.join(args.keys)} of {_quota_entity(args)}")


def cmd_quotas_list(args: argparse.Namespace) -> None:
    from rayk.quotas import CLIENT_ID, MATCH_DEFAULT, MATCH_EXACT, USER, QuotaFilterComponent

    components = []
    for entity_type, name, default in ((USER, args.user, args.user_default), (CLIENT_ID, args.client_id, args.client_id_default)):
        if default:
            components.append(QuotaFilterComponent(entity_type, MATCH_DEFAULT))
        elif name is not None:
            components.append(QuotaFilterComponent(entity_type, MATCH_EXACT, name))
    found = _connect(args).admin().describe_client_quotas(components)
    rows = [(_quota_cell(e.user), _quota_cell(e.client_id), key, _quota_number(value))
            for e, values in found.items() for key, value in sorted(values.items())]
    if rows:
        say(args, table(("user", "client-id", "quota", "value"), rows))


# ---------------------------------------------------------------------------- produce, consume


def _split_key(line: bytes, separator: bytes, line_number: int) -> tuple[bytes, bytes]:
    key, sep, value = line.partition(separator)
    if not sep:
        raise CliError(f"line {line_number} has no key separator {separator.decode()!r}")
    return key, value


def cmd_produce(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    cluster.describe_topic(args.topic)  # an unknown topic fails before stdin is read
    separator = args.key_separator.encode() if args.key_separator else None
    completed: list[BaseException | None] = []  # list.append is atomic: any thread may complete

    def on_done(future: Any) -> None:
        completed.append(future.exception())

    sent = 0
    with cluster.producer(acks=args.acks) as producer:
        for sent, line in enumerate(sys.stdin.buffer, 1):
            line = line.removesuffix(b"\n").removesuffix(b"\r")
            key, value = _split_key(line, separator, sent) if separator else (None, line)
            producer.send(args.topic, value, key=key, callback=on_done)
    failures = [e for e in completed if e is not None]
    if failures:
        raise CliError(f"{len(failures)} of {sent} records failed: {_error_message(failures[0])}")
    print(f"{sent} records produced", file=sys.stderr)


def _console_consumer(cluster: Any, args: argparse.Namespace) -> Any:
    from rayk.client.types import TopicPartition

    partitions = len(cluster.describe_topic(args.topic))
    reset = "earliest" if args.from_beginning else "latest"
    if args.group is not None:
        return cluster.consumer(args.topic, group_id=args.group, auto_offset_reset=reset)
    consumer = cluster.consumer(auto_offset_reset=reset)
    consumer.assign([TopicPartition(args.topic, p) for p in range(partitions)])
    return consumer


def _format_record(record: Any, print_key: bool) -> bytes:
    value = b"null" if record.value is None else record.value
    if not print_key:
        return value + b"\n"
    return (b"null" if record.key is None else record.key) + b"\t" + value + b"\n"


def cmd_consume(args: argparse.Namespace) -> None:
    cluster = _connect(args)
    consumer = _console_consumer(cluster, args)
    out = args.out.buffer
    limit = args.max_messages if args.max_messages is not None else float("inf")
    idle_limit_s = args.timeout_ms / 1000 if args.timeout_ms is not None else float("inf")
    count = 0
    try:
        last_record_at = time.monotonic()
        while count < limit and time.monotonic() - last_record_at < idle_limit_s:
            wait_s = min(1.0, idle_limit_s - (time.monotonic() - last_record_at))
            max_records = None if limit == float("inf") else int(limit - count)
            polled = consumer.poll(timeout_ms=max(1, int(wait_s * 1000)), max_records=max_records)
            for records in polled.values():
                out.write(b"".join(_format_record(r, args.print_key) for r in records))
                count += len(records)
            if polled:
                out.flush()
                last_record_at = time.monotonic()
    except KeyboardInterrupt:
        return  # Ctrl-C: close (and commit) quietly
    except BrokenPipeError:  # `rayk consume ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), args.out.fileno())
        return
    finally:
        consumer.close()
    print(f"{count} messages consumed", file=sys.stderr)


# ---------------------------------------------------------------------------- perf


def cmd_perf_produce(args: argparse.Namespace) -> None:
    from rayk.perf import format_summary, run_produce_perf

    figures = run_produce_perf(
        _connect(args),
        args.topic,
        args.num_records,
        args.record_size,
        acks=args.acks,
        throughput=args.throughput,
        batch_size=args.batch_size,
        linger_ms=args.linger_ms,
        buffer_memory=args.buffer_memory,
    )
    say(args, format_summary(figures))
    if figures["errors"]:
        raise CliError(f"{figures['errors']} records failed: {figures['first_error']}")


def cmd_perf_consume(args: argparse.Namespace) -> None:
    from rayk.perf import format_summary, run_consume_perf

    cluster = _connect(args)
    figures = run_consume_perf(cluster, args.topic, args.messages, group=args.group, timeout_ms=args.timeout_ms)
    say(args, format_summary(figures))
    if figures["timed_out"]:
        got = f"{figures['records']} of {args.messages} messages"
        raise CliError(f"no record for {args.timeout_ms} ms after {got}")


# ---------------------------------------------------------------------------- demo

DEMO_NAMESPACE = "rayk-demo"
DEMO_TOPIC, DEMO_GROUP = "demo", "demo-group"
DEMO_PARTITIONS, DEMO_REPLICATION, DEMO_MIN_ISR = 3, 3, 2  # a leader on each broker
DEMO_RECORD_BYTES = 100
DEMO_BATCH_RECORDS = 10_000  # records per Producer.send_batch call
# Latency is what waits in the producer's buffer (Little's law): at ~210k rec/s here,
# 2, 4, 8 and 32 MiB buffers gave the same rate and p50 latencies of 52, 136, 333 and
# 1,267 ms, so the demo keeps 4 MiB.
DEMO_BUFFER_MEMORY = 4 * 1024 * 1024
DEMO_KEYS = [b"key-%03d" % k for k in range(1000)]
_DEMO_PADDING = b"." * (DEMO_RECORD_BYTES - 12)


def demo_columns(first: int, count: int) -> tuple[Any, Any]:
    """The keys and values of demo records first..first+count-1 as columns for
    send_batch: the records `demo_record` makes, built with numpy."""
    import numpy as np
    import pyarrow as pa

    seq = np.arange(first, first + count, dtype=np.int64)
    digits = (seq[:, None] // 10 ** np.arange(11, -1, -1, dtype=np.int64)) % 10 + ord("0")
    values = np.empty((count, DEMO_RECORD_BYTES), dtype=np.uint8)
    values[:, :12] = digits
    values[:, 12:] = ord(".")
    return _demo_key_column().take(pa.array(seq % len(DEMO_KEYS))), values


@functools.cache
def _demo_key_column() -> Any:
    import pyarrow as pa

    return pa.array(DEMO_KEYS, pa.binary())


def demo_record(seq: int) -> tuple[bytes, bytes]:
    """Record `seq` of the demo: a key among 1000 (spread over partitions) and a
    100-byte value starting with the sequence number in 12 digits."""
    return DEMO_KEYS[seq % len(DEMO_KEYS)], b"%012d" % seq + _DEMO_PADDING


class DeliveryCheck:
    """Sees every consumed demo record: each sequence number exactly once, and increasing
    within each partition (the order it was produced in)."""

    def __init__(self, records: int) -> None:
        self.seen = bytearray(records)
        self.duplicates = self.foreign = self.out_of_order = 0
        self.last_seq: dict[int, int] = {}
        self.per_partition: dict[int, int] = {}

    def __call__(self, record: Any) -> None:
        try:
            seq = int(record.value[:12])
        except (TypeError, ValueError):
            seq = -1
        if not 0 <= seq < len(self.seen):
            self.foreign += 1
            return
        if self.seen[seq]:
            self.duplicates += 1
        self.seen[seq] = 1
        if seq <= self.last_seq.get(record.partition, -1):
            self.out_of_order += 1
        self.last_seq[record.partition] = seq
        self.per_partition[record.partition] = self.per_partition.get(record.partition, 0) + 1

    @property
    def missing(self) -> int:
        return len(self.seen) - sum(self.seen)

    @property
    def exactly_once(self) -> bool:
        return self.missing == 0 and self.duplicates == 0 and self.foreign == 0

    @property
    def in_order(self) -> bool:
        return self.out_of_order == 0


def cmd_demo(args: argparse.Namespace) -> int:
    import ray

    import rayk
    from rayk.ray_settings import RAY_SYSTEM_CONFIG

    started = time.monotonic()
    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="rayk-demo-"))
    say(args, f"rayk demo: {args.records:,} records of {DEMO_RECORD_BYTES} bytes, 3 brokers, data in {data_dir}")
    ray.init(address="local", namespace=DEMO_NAMESPACE, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR, _system_config=dict(RAY_SYSTEM_CONFIG))  # fmt: skip
    try:
        cluster = rayk.start(3, data_dir, namespace=DEMO_NAMESPACE, config={"group.initial.rebalance.delay.ms": 0})
        try:
            return run_demo(args, cluster, started)
        finally:
            cluster.shutdown()
    finally:
        ray.shutdown()
        if not args.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)


def run_demo(args: argparse.Namespace, cluster: Any, started: float) -> int:
    """`rayk demo` on a running `cluster`: `args.records` records produced with acks=all,
    consumed by a group and checked (each once, in order per partition); the summary goes to
    `args.out`. 0 if every check passed. examples/demo.py runs it, then the other examples,
    on one cluster."""
    from rayk.perf import run_consume_perf, run_produce_batch_perf

    topic_config = {"min.insync.replicas": str(DEMO_MIN_ISR)}
    partitions = cluster.create_topic(DEMO_TOPIC, DEMO_PARTITIONS, DEMO_REPLICATION, topic_config)
    say(args, f"topic {DEMO_TOPIC!r}: {DEMO_PARTITIONS} partitions, replication factor {DEMO_REPLICATION}, "
              f"min.insync.replicas {DEMO_MIN_ISR}; leaders {[p['leader'] for p in partitions]}")  # fmt: skip
    records = args.records
    produced = run_produce_batch_perf(
        cluster, DEMO_TOPIC, records, DEMO_RECORD_BYTES,
        acks="all", batch_records=DEMO_BATCH_RECORDS, columns_fn=demo_columns, buffer_memory=DEMO_BUFFER_MEMORY,
        label="produce",
    )  # fmt: skip
    check = DeliveryCheck(records)
    consumed = run_consume_perf(cluster, DEMO_TOPIC, records, group=DEMO_GROUP, on_record=check, label="consume")
    leaders = [p["leader"] for p in cluster.describe_topic(DEMO_TOPIC)]
    say(args, "\n" + _demo_summary(records, produced, consumed, leaders, check, time.monotonic() - started))
    passed = check.exactly_once and check.in_order and produced["errors"] == 0
    return 0 if passed else 1


def _demo_summary(
    records: int, produced: dict, consumed: dict, leaders: list[int], check: DeliveryCheck, elapsed_s: float
) -> str:
    rows = [
        ("records", f"{records:,} x {DEMO_RECORD_BYTES} bytes"),
        (f"produce (acks=all, send_batch of {DEMO_BATCH_RECORDS:,})", _produce_figures(produced)),
        (f"consume ({DEMO_GROUP})", _consume_figures(consumed)),
        ("partitions", f"{len(leaders)} (replication factor {DEMO_REPLICATION}, min.insync.replicas {DEMO_MIN_ISR})"),
        ("leaders", " ".join(f"p{p}->broker {b}" for p, b in enumerate(leaders))),
        ("records per partition", " ".join(f"p{p}:{n:,}" for p, n in sorted(check.per_partition.items())) or "-"),
        ("exactly once", _verdict(check.exactly_once, f"{check.missing:,} missing, {check.duplicates:,} duplicates, "
                                                      f"{check.foreign:,} unknown")),
        ("order per partition", _verdict(check.in_order, f"{check.out_of_order:,} out of order")),
        ("total time", f"{elapsed_s:.1f} s"),
    ]  # fmt: skip
    return table(("summary", ""), rows)


def _produce_figures(f: dict) -> str:
    failed = f"  {f['errors']:,} FAILED: {f['first_error']}" if f["errors"] else ""
    return (
        f"{f['records_per_s']:,.0f} rec/s  {f['mb_per_s']:.2f} MB/s  "
        f"latency p50 {f['latency_p50_ms']:,.1f} ms  p99 {f['latency_p99_ms']:,.1f} ms{failed}"
    )


def _consume_figures(f: dict) -> str:
    return (
        f"{f['fetch_records_per_s']:,.0f} rec/s  {f['fetch_mb_per_s']:.2f} MB/s  "
        f"(from the first record on; joining the group and the first fetch took {f['first_record_s']:.1f} s)"
    )


def _verdict(ok: bool, details: str) -> str:
    return f"{'passed' if ok else 'FAILED'} ({details})"


# ---------------------------------------------------------------------------- the parser


def _connection_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("cluster")
    group.add_argument("--address", default="auto", help='Ray cluster address (default "auto": the local one)')
    group.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the rayk cluster's Ray namespace (default rayk)")
    return parent


def _config_option(parser: argparse.ArgumentParser, what: str, required: bool = False) -> None:
    parser.add_argument(
        "--config", nargs="+", action="extend", type=_key_value, default=[], required=required,
        metavar="KEY=VALUE", help=f"{what} (Kafka names), repeatable",
    )  # fmt: skip


def _add(subparsers: Any, name: str, run: Callable, summary: str, parents: Sequence[Any] = ()) -> Any:
    """A subcommand that runs `run(args)`."""
    parser = subparsers.add_parser(name, help=summary, description=summary, parents=list(parents))
    parser.set_defaults(run=run)
    return parser


def _add_cluster_commands(sub: Any, conn: argparse.ArgumentParser) -> None:
    start = _add(sub, "start", cmd_start, "deploy a rayk cluster onto the Ray cluster and exit", [conn])
    start.add_argument("--brokers", type=_positive_int, default=3, help="number of brokers (default 3)")
    start.add_argument("--data-dir", default="./rayk-data", help="the brokers' log directory (default ./rayk-data)")
    start.add_argument(
        "--node-resource", metavar="NAME",
        help="place brokers only on Ray nodes offering this custom resource (e.g. rayk_broker), one per node",
    )  # fmt: skip
    start.add_argument(
        "--wait-for-nodes", dest="wait_for_nodes_s", type=float, default=0, metavar="SECONDS",
        help="first wait up to SECONDS for one node per broker (with --node-resource: nodes offering it)",
    )  # fmt: skip
    start.add_argument(
        "--autoscale", action="store_true",
        help="follow Ray's autoscaler: --brokers is the minimum, one broker per node offering --node-resource "
             "(default rayk_broker), nodes asked for when a topic does not fit, idle brokers removed "
             "(broker.idle.removal.ms) so that their nodes can go",
    )  # fmt: skip
    _config_option(start, "broker setting")
    _add(sub, "status", cmd_status, "brokers, topics, under-replicated partitions and health metrics", [conn])
    _add(sub, "stop", cmd_stop, "stop the rayk cluster cleanly (its data stays on disk)", [conn])


def _add_broker_commands(sub: Any, conn: argparse.ArgumentParser) -> None:
    brokers = sub.add_parser("brokers", help="list, add and remove brokers while the cluster runs", description="brokers")
    bsub = brokers.add_subparsers(dest="brokers_command", required=True, metavar="COMMAND")
    _add(bsub, "list", cmd_brokers_list, "the brokers: node, listeners, replicas and leaders held, state", [conn])
    add = _add(bsub, "add", cmd_brokers_add, "start a new broker; the balancer gives it its share of the partitions", [conn])
    add.add_argument("--node-id", help="the Ray node to run it on (default: the one running the fewest brokers)")
    remove = _add(bsub, "remove", cmd_brokers_remove,
                  "decommission a broker: its replicas move to the others first, then it stops and leaves", [conn])
    remove.add_argument("broker_id", type=_non_negative_int)
    remove.add_argument("--timeout", dest="timeout_s", type=float, default=600, metavar="SECONDS",
                        help="give up waiting after this long (the decommission goes on; default 600)")


def _add_topic_commands(sub: Any, conn: argparse.ArgumentParser) -> None:
    topics = sub.add_parser("topics", help="create, list, describe, alter, delete and reassign topics",
                            description="topics")
    tsub = topics.add_subparsers(dest="topics_command", required=True, metavar="COMMAND")
    create = _add(tsub, "create", cmd_topics_create, "create a topic", [conn])
    create.add_argument("name")
    create.add_argument("--partitions", type=_positive_int, help="default: the brokers' num.partitions")
    create.add_argument("--replication-factor", type=_positive_int, help="default: default.replication.factor")
    _config_option(create, "topic config")
    _add(tsub, "list", cmd_topics_list, "list the topics", [conn])
    describe = _add(tsub, "describe", cmd_topics_describe, "partitions, leaders, ISRs, offsets and configs", [conn])
    describe.add_argument("name")
    alter = _add(tsub, "alter", cmd_topics_alter, "add partitions to a topic, or set its configs", [conn])
    alter.add_argument("name")
    alter.add_argument("--partitions", type=_positive_int, metavar="N",
                       help="the new, larger partition count (partitions are only added)")
    _config_option(alter, "topic config")
    _add(tsub, "delete", cmd_topics_delete, "delete a topic and its data", [conn]).add_argument("name")
    delete_records = _add(tsub, "delete-records", cmd_topics_delete_records,
                          "delete a partition's records below an offset (its log start moves there)", [conn])
    delete_records.add_argument("name")
    delete_records.add_argument("--partition", type=_non_negative_int, metavar="N", help="only this partition (default: every one)")
    delete_records.add_argument("--offset", type=_deletion_offset, required=True, metavar="OFFSET",
                                help="records below it are deleted; -1: below the high watermark (every committed record)")
    reassign = _add(tsub, "reassign", cmd_topics_reassign,
                    "move a partition to other brokers (new replicas catch up before old ones go), or cancel", [conn])
    reassign.add_argument("name")
    reassign.add_argument("--partition", type=_non_negative_int, required=True, metavar="N", help="the partition to move")
    target = reassign.add_mutually_exclusive_group(required=True)
    target.add_argument("--replicas", type=_broker_list, metavar="IDS",
                        help="the target brokers, comma-separated, the first the preferred leader (e.g. 3,1,2)")
    target.add_argument("--cancel", action="store_true", help="cancel the reassignment under way")
    elect = _add(tsub, "elect-leaders", cmd_topics_elect_leaders,
                 "give partitions their preferred leader back (or elect a leaderless one uncleanly)", [conn])
    elect.add_argument("name", nargs="?", help="only this topic's partitions (default: every partition)")
    elect.add_argument("--partition", type=_non_negative_int, metavar="N", help="only this partition of the topic")
    elect.add_argument("--type", choices=("preferred", "unclean"), default="preferred",
                       help="preferred: the first replica leads again; unclean: any live replica of a leaderless partition")
    reassignments = _add(tsub, "reassignments", cmd_topics_reassignments,
                         "list the partition reassignments in progress", [conn])
    reassignments.add_argument("name", nargs="?", help="only this topic's")


def _add_group_commands(sub: Any, conn: argparse.ArgumentParser) -> None:
    groups = sub.add_parser("groups", help="list and describe consumer groups", description="consumer groups")
    gsub = groups.add_subparsers(dest="groups_command", required=True, metavar="COMMAND")
    _add(gsub, "list", cmd_groups_list, "list the consumer groups", [conn])
    describe = _add(gsub, "describe", cmd_groups_describe, "members, committed offsets and lag of a group", [conn])
    describe.add_argument("group")
    delete = _add(gsub, "delete", cmd_groups_delete, "delete a group without members, and its committed offsets", [conn])
    delete.add_argument("group")
    delete_offsets = _add(gsub, "delete-offsets", cmd_groups_delete_offsets,
                          "delete a group's committed offsets of a topic its members do not consume", [conn])
    delete_offsets.add_argument("group")
    delete_offsets.add_argument("topic")
    delete_offsets.add_argument("--partition", type=_non_negative_int, metavar="N", help="only this partition (default: every one)")


def _add_user_commands(sub: Any, conn: argparse.ArgumentParser) -> None:
    from rayk.scram import DEFAULT_ITERATIONS, MECHANISMS

    users = sub.add_parser("users", help="SCRAM credentials of SASL users", description="SCRAM credentials")
    usub = users.add_subparsers(dest="users_command", required=True, metavar="COMMAND")
    set_ = _add(usub, "set", cmd_users_set,
                "set a user's SCRAM credential (the password is read from the terminal or stdin)", [conn])
    set_.add_argument("user")
    set_.add_argument("--mechanism", choices=sorted(MECHANISMS), default="SCRAM-SHA-512", help="default SCRAM-SHA-512")
    set_.add_argument("--iterations", type=_positive_int, default=DEFAULT_ITERATIONS,
                      help=f"PBKDF2 iterations, 4096..16384 (default {DEFAULT_ITERATIONS})")
    delete = _add(usub, "delete", cmd_users_delete, "delete a user's SCRAM credential", [conn])
    delete.add_argument("user")
    delete.add_argument("--mechanism", choices=sorted(MECHANISMS), required=True)
    list_ = _add(usub, "list", cmd_users_list, "users with SCRAM credentials: mechanisms and iterations", [conn])
    list_.add_argument("users", nargs="*", help="only these users (default: all)")


def _acl_resource_options(parser: argparse.ArgumentParser) -> None:
    resource = parser.add_mutually_exclusive_group()
    resource.add_argument("--topic", metavar="NAME", help="a topic (* for every topic)")
    resource.add_argument("--group", metavar="NAME", help="a consumer group (* for every group)")
    resource.add_argument("--transactional-id", metavar="ID")
    resource.add_argument("--cluster", action="store_true", help="the cluster")
    parser.add_argument("--resource-pattern-type", choices=("literal", "prefixed"),
                        help="the name is the resource's (literal, the default when adding) or a prefix of it")


def _add_acl_commands(sub: Any, conn: argparse.ArgumentParser) -> None:
    from rayk.acls import OPERATIONS

    acls = sub.add_parser("acls", help="add, list and remove ACLs (kafka-acls)", description="ACLs")
    asub = acls.add_subparsers(dest="acls_command", required=True, metavar="COMMAND")
    add = _add(asub, "add", cmd_acls_add, "allow or deny principals operations on a resource", [conn])
    add.add_argument("--allow-principal", action="append", default=[], metavar="PRINCIPAL", help="e.g. User:alice, User:*")
    add.add_argument("--deny-principal", action="append", default=[], metavar="PRINCIPAL")
    add.add_argument("--operation", action="append", choices=sorted(OPERATIONS), help="repeatable")
    add.add_argument("--host", default="*", help="the client address it applies to (default *: any)")
    _acl_resource_options(add)
    for name, run, summary in (("list", cmd_acls_list, "the ACLs, or those of a resource or principal"),
                               ("remove", cmd_acls_remove, "remove the ACLs of a resource or principal")):
        parser = _add(asub, name, run, summary, [conn])
        parser.add_argument("--principal", metavar="PRINCIPAL", help="only this principal's")
        _acl_resource_options(parser)


def _quota_entity_options(parser: argparse.ArgumentParser) -> None:
    user = parser.add_mutually_exclusive_group()
    user.add_argument("--user", metavar="NAME", help="a user (a principal's name: alice for User:alice)")
    user.add_argument("--user-default", action="store_true", help="the default user: every user without its own quota")
    client = parser.add_mutually_exclusive_group()
    client.add_argument("--client-id", metavar="ID", help="a client id (client.id)")
    client.add_argument("--client-id-default", action="store_true",
                        help="the default client id: every client id without its own quota")


def _add_quota_commands(sub: Any, conn: argparse.ArgumentParser) -> None:
    from rayk.quotas import QUOTA_KEYS

    quotas = sub.add_parser("quotas", help="client quotas of users and client ids (kafka-configs)",
                            description="client quotas: " + ", ".join(QUOTA_KEYS))
    qsub = quotas.add_subparsers(dest="quotas_command", required=True, metavar="COMMAND")
    set_ = _add(qsub, "set", cmd_quotas_set, "set quotas of a user, a client id or both", [conn])
    _quota_entity_options(set_)
    set_.add_argument("quotas", nargs="+", type=_key_value, metavar="KEY=VALUE",
                      help="producer_byte_rate / consumer_byte_rate (bytes/s), request_percentage (%% of a thread)")
    delete = _add(qsub, "delete", cmd_quotas_delete, "remove quotas of a user, a client id or both", [conn])
    _quota_entity_options(delete)
    delete.add_argument("keys", nargs="+", choices=QUOTA_KEYS, metavar="KEY", help=", ".join(QUOTA_KEYS))
    list_ = _add(qsub, "list", cmd_quotas_list, "the quotas, or those of a user or client id", [conn])
    _quota_entity_options(list_)


def _add_client_commands(sub: Any, conn: argparse.ArgumentParser) -> None:
    produce = _add(sub, "produce", cmd_produce, "send each line of stdin as a record", [conn])
    produce.add_argument("topic")
    produce.add_argument("--key-separator", metavar="SEP", help="lines are KEY<SEP>VALUE")
    produce.add_argument("--acks", choices=("all", "1", "0"), default="all", help="default all")
    consume = _add(sub, "consume", cmd_consume, "print the records of a topic, one value per line", [conn])
    consume.add_argument("topic")
    consume.add_argument("--group", help="consume as a member of this consumer group (commits offsets)")
    consume.add_argument("--from-beginning", action="store_true",
                         help="start at the earliest offset (if none committed)")
    consume.add_argument("--max-messages", type=_positive_int, metavar="N", help="stop after N records")
    consume.add_argument("--timeout-ms", type=_positive_int, metavar="T", help="stop after T ms without a record")
    consume.add_argument("--print-key", action="store_true", help="print KEY<TAB>VALUE")


def _add_perf_commands(sub: Any, conn: argparse.ArgumentParser) -> None:
    perf = sub.add_parser("perf", help="producer and consumer performance tests", description="performance tests")
    psub = perf.add_subparsers(dest="perf_command", required=True, metavar="COMMAND")
    produce = _add(psub, "produce", cmd_perf_produce, "produce as fast as possible (or at --throughput)", [conn])
    produce.add_argument("--topic", required=True)
    produce.add_argument("--num-records", type=_positive_int, required=True)
    produce.add_argument("--record-size", type=_positive_int, required=True, help="bytes per record")
    produce.add_argument("--acks", choices=("all", "1", "0"), default="all", help="default all")
    produce.add_argument("--throughput", type=float, default=-1, metavar="RPS", help="records/s cap (default -1: none)")
    produce.add_argument("--batch-size", type=_positive_int, default=PERF_BATCH_SIZE, help="bytes per batch (default 1 MiB)")
    produce.add_argument("--linger-ms", type=int, default=PERF_LINGER_MS, help=f"default {PERF_LINGER_MS}")
    produce.add_argument("--buffer-memory", type=_positive_int, default=KAFKA_BUFFER_MEMORY,
                         help="bytes of unacknowledged records before sends wait (default 32 MiB)")  # fmt: skip
    consume = _add(psub, "consume", cmd_perf_consume, "consume records from the beginning of a topic", [conn])
    consume.add_argument("--topic", required=True)
    consume.add_argument("--messages", type=_positive_int, required=True)
    consume.add_argument("--group", help="consume as a member of this group (default: no group)")
    consume.add_argument("--timeout-ms", type=_positive_int, default=10_000,
                         help="give up after this long without a record (default 10000)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="rayk: a Kafka-style replicated log on Ray.")
    parser.add_argument("--version", action="version", version=f"{PROG} {rayk.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    conn = _connection_options()
    _add_cluster_commands(sub, conn)
    _add_broker_commands(sub, conn)
    _add_topic_commands(sub, conn)
    _add_group_commands(sub, conn)
    _add_user_commands(sub, conn)
    _add_acl_commands(sub, conn)
    _add_quota_commands(sub, conn)
    _add_client_commands(sub, conn)
    _add_perf_commands(sub, conn)
    demo = _add(sub, "demo", cmd_demo, "start Ray and 3 brokers locally, produce, consume and check records")
    demo.add_argument("--records", type=_positive_int, default=1_000_000, help="default 1,000,000")
    demo.add_argument("--data-dir", help="keep the data here (default: a temporary directory, removed at the end)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Ray prints cluster-wide warnings ("N PYTHON worker processes have been started ...") on
    # the driver's sys.stdout. Commands write their results to `args.out`, the real stdout, and
    # anything else printed goes to stderr, so `rayk consume > file` holds records only.
    args.out, sys.stdout = sys.stdout, sys.stderr
    try:
        return args.run(args) or 0
    except KeyboardInterrupt:
        return 130
    except (CliError, KafkaError) as e:
        print(f"{PROG}: error: {_error_message(e)}", file=sys.stderr)
        return 1
    finally:
        _shutdown_ray()
        sys.stdout = args.out


if __name__ == "__main__":
    sys.exit(main())
