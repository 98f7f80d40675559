"""Kafka's `listeners` / `advertised.listeners` values, as rayk reads them.

One PLAINTEXT listener per broker: `PLAINTEXT://host:port`. A cluster has one config for
all its brokers, so broker b listens on port + b (port 0: any free port); an empty host
means the node's IP address. TLS and SASL listeners are not supported.
"""

from __future__ import annotations

from rayk.errors import InvalidConfigurationError

NAME = "PLAINTEXT"  # the listener's name, as Kafka tags its listener metrics
SCHEME = f"{NAME}://"


def parse_listener(text: str, name: str = "listeners") -> tuple[str, int] | None:
    """(host, base port), or None for an empty value (no listener)."""
    text = text.strip()
    if not text:
        return None
    if "," in text:
        raise InvalidConfigurationError(f"{name} = {text!r}: rayk brokers have one listener")
    if not text.upper().startswith(SCHEME):
        raise InvalidConfigurationError(f"{name} = {text!r}: only {SCHEME}host:port listeners are supported")
    host, sep, port_text = text[len(SCHEME):].rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InvalidConfigurationError(f"{name} = {text!r}: expected {SCHEME}host:port with a port in 0..65535")
    return host.strip("[]"), int(port_text)


def broker_port(base_port: int, broker_id: int) -> int:
    """Broker `broker_id`'s port: base + id, or 0 (any free port) for base 0."""
    if base_port == 0:
        return 0
    port = base_port + broker_id
    if port > 65535:
        raise InvalidConfigurationError(f"broker {broker_id} would listen on port {port} (> 65535)")
    return port
