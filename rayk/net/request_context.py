"""Who sent a request and how: the listener it came in on, that listener's security
protocol, the client's authenticated principal and its host (Kafka's RequestContext).

The listener sets it once per connection (TLS gives the principal of a client
certificate); handlers read it to answer in the listener's own terms, e.g. Metadata lists
every broker's address on the listener the request arrived on, as Kafka does.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from rayk.listeners import PLAINTEXT

ANONYMOUS = "User:ANONYMOUS"  # Kafka's principal of a client that did not authenticate


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Who sent a request and on which listener: the listener's name and security protocol, the
    client's principal and host, and whether the listener authenticates every client.
    Immutable: a connection's KafkaChannel holds one, replaced when SASL authenticates."""

    listener_name: str
    security_protocol: str
    principal: str  # "User:<name>"
    client_host: str  # as Java writes an address (kafka_host): what ACL hosts are compared with
    # Every client of the listener proves who it is (SASL, or TLS with ssl.client.auth
    # required): topics are then never created by a Metadata request.
    listener_authenticates: bool = False


PLAINTEXT_CONTEXT = RequestContext(PLAINTEXT, PLAINTEXT, ANONYMOUS, "")


def kafka_host(address: str) -> str:
    """A client address as Kafka's InetAddress.getHostAddress() writes it, which is what an
    ACL's host is compared with: IPv4 dotted, IPv6 in full groups without leading zeros
    (`0:0:0:0:0:0:0:1`, not `::1`), an IPv4-mapped IPv6 address as its IPv4 one."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return ":".join(f"{int(group, 16):x}" for group in ip.exploded.split(":"))
    return str(ip)
