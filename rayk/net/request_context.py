"""Who sent a request and how: the listener it came in on, that listener's security
protocol, the client's authenticated principal and its host (Kafka's RequestContext).

The listener sets it once per connection (TLS gives the principal of a client
certificate); handlers read it to answer in the listener's own terms, e.g. Metadata lists
every broker's address on the listener the request arrived on, as Kafka does.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayk.listeners import PLAINTEXT

ANONYMOUS = "User:ANONYMOUS"  # Kafka's principal of a client that did not authenticate


@dataclass(frozen=True, slots=True)
class RequestContext:
    listener_name: str
    security_protocol: str
    principal: str  # "User:<name>"
    client_host: str
    # Every client of the listener proves who it is (SASL, or TLS with ssl.client.auth
    # required): topics are then never created by a Metadata request.
    listener_authenticates: bool = False


PLAINTEXT_CONTEXT = RequestContext(PLAINTEXT, PLAINTEXT, ANONYMOUS, "")
