"""Kafka's listener settings as rayk reads them: `listeners`, `advertised.listeners` and
`listener.security.protocol.map`.

A broker serves one Kafka listener per entry of `listeners`, `NAME://host:port`, e.g.
`INTERNAL://:9092,EXTERNAL://0.0.0.0:9192`. A listener's security protocol is what
`listener.security.protocol.map` (`NAME:PROTOCOL,...`) maps its name to; Kafka's default
map names each protocol after itself, so `SSL://:9093` needs no map. Names are
case-insensitive (kept in upper case, as Kafka's ListenerName does) and unique.

A cluster has one config for all its brokers, so broker b listens on port + b (port 0:
any free port), and an empty host means the node's IP address. `advertised.listeners`
names, per listener, the address clients are told to use; a listener it does not name is
advertised where it is bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayk.errors import InvalidConfigurationError

PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
DEFAULT_SECURITY_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in SECURITY_PROTOCOLS)


@dataclass(frozen=True, slots=True)
class Listener:
    """One named listener of every broker."""

    name: str  # upper case
    security_protocol: str  # one of SECURITY_PROTOCOLS
    host: str  # "" = the node's IP address
    base_port: int  # broker b binds base_port + b; 0 = any free port
    advertised_host: str | None = None  # None: where it is bound
    advertised_base_port: int | None = None

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in (SSL, SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in (SASL_PLAINTEXT, SASL_SSL)


def parse_listeners(listeners: str, advertised_listeners: str = "",
                    protocol_map: str = DEFAULT_SECURITY_PROTOCOL_MAP) -> tuple[Listener, ...]:
    """The listeners of `listeners`, in its order (empty: no Kafka listener); raises
    InvalidConfigurationError naming the setting at fault."""
    protocols = _parse_protocol_map(protocol_map)
    bound = _parse_addresses(listeners, "listeners")
    advertised = _parse_addresses(advertised_listeners, "advertised.listeners")
    for name in advertised:
        if name not in bound:
            raise InvalidConfigurationError(f"advertised.listeners names {name}, which listeners does not")
    ports = [port for _, port in bound.values() if port != 0]
    if len(ports) != len(set(ports)):
        raise InvalidConfigurationError(f"listeners = {listeners!r}: two listeners on one port")
    out = []
    for name, (host, port) in bound.items():
        protocol = protocols.get(name)
        if protocol is None:
            raise InvalidConfigurationError(
                f"listener {name} has no security protocol: add {name}:<protocol> to listener.security.protocol.map "
                f"(one of {', '.join(SECURITY_PROTOCOLS)})"
            )
        ad_host, ad_port = advertised.get(name, (None, None))
        out.append(Listener(name, protocol, host, port, ad_host, ad_port))
    return tuple(out)


def _parse_protocol_map(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, sep, protocol = entry.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or protocol not in SECURITY_PROTOCOLS:
            raise InvalidConfigurationError(
                f"listener.security.protocol.map entry {entry!r}: expected NAME:PROTOCOL with a protocol in "
                f"{', '.join(SECURITY_PROTOCOLS)}"
            )
        if name in out:
            raise InvalidConfigurationError(f"listener.security.protocol.map maps {name} twice")
        out[name] = protocol
    return out


def _parse_addresses(text: str, setting: str) -> dict[str, tuple[str, int]]:
    """NAME -> (host, base port) of a `listeners`-style value."""
    out: dict[str, tuple[str, int]] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, sep, address = entry.partition("://")
        name = name.strip().upper()
        host, colon, port_text = address.rpartition(":")
        if not sep or not name or not colon or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise InvalidConfigurationError(
                f"{setting} entry {entry!r}: expected NAME://host:port with a port in 0..65535"
            )
        if name in out:
            raise InvalidConfigurationError(f"{setting} names listener {name} twice")
        out[name] = (host.strip("[]"), int(port_text))
    return out


def broker_port(base_port: int, broker_id: int) -> int:
    """Broker `broker_id`'s port: base + id, or 0 (any free port) for base 0."""
    if base_port == 0:
        return 0
    port = base_port + broker_id
    if port > 65535:
        raise InvalidConfigurationError(f"broker {broker_id} would listen on port {port} (> 65535)")
    return port
