"""ScramControlManager: users' SCRAM credentials (Kafka's ScramControlManager).

Owns each user's credential per mechanism: salt, StoredKey, ServerKey and iterations,
never a password. Plans AlterUserScramCredentials as records; changes only by replaying
them. Pure: no I/O, no Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rayk.errors import DuplicateResourceError, KafkaError, ResourceNotFoundError, UnacceptableCredentialError
from rayk.metadata.records import MetadataRecord, RemoveScramCredentialRecord, ScramCredentialRecord
from rayk.scram import ScramCredential


class ScramControlManager:
    """The SCRAM domain of the Controller's image: owns every user's credentials, by mechanism.
    Plans AlterUserScramCredentials; changes only by replay (ClusterMetadata.apply). Pure;
    called from the Controller's loop."""

    def __init__(self) -> None:
        self.credentials: dict[str, dict[str, ScramCredential]] = {}  # user -> mechanism -> credential

    def handlers(self) -> dict[type[MetadataRecord], Callable[[Any, int], None]]:
        return {ScramCredentialRecord: self._replay_credential, RemoveScramCredentialRecord: self._replay_remove}

    def _replay_credential(self, record: ScramCredentialRecord, offset: int) -> None:
        self.credentials.setdefault(record.user, {})[record.mechanism] = record.credential

    def _replay_remove(self, record: RemoveScramCredentialRecord, offset: int) -> None:
        held = self.credentials[record.user]
        del held[record.mechanism]
        if not held:
            del self.credentials[record.user]

    def image_records(self) -> list[MetadataRecord]:
        return [ScramCredentialRecord.of(user, c) for user, held in self.credentials.items() for c in held.values()]

    def describe(self, users: Sequence[str] | None) -> dict[str, list[tuple[str, int]] | KafkaError]:
        """Per user (all with one, or those named) its (mechanism, iterations), or
        RESOURCE_NOT_FOUND; never a key or a salt."""
        names = sorted(self.credentials) if users is None else users
        return {
            user: [(c.mechanism, c.iterations) for c in self.credentials[user].values()] if user in self.credentials
            else ResourceNotFoundError(f"user {user!r} has no SCRAM credential")
            for user in names
        }

    def plan_alter(
        self, deletions: Sequence[tuple[str, str]], upsertions: Sequence[tuple[str, ScramCredential | KafkaError]]
    ) -> tuple[list[MetadataRecord], dict[str, KafkaError | None]]:
        """Kafka's AlterUserScramCredentials: the records, and per user None or the error
        that refused every change asked for that user (an empty name, a credential that
        could not be made, a mechanism named twice, deleting one the user lacks)."""
        results: dict[str, KafkaError | None] = {}
        seen: set[tuple[str, str]] = set()
        for user, mechanism in [*deletions, *((u, c.mechanism) for u, c in upsertions if isinstance(c, ScramCredential))]:
            if (user, mechanism) in seen:
                results[user] = DuplicateResourceError(f"{mechanism} for user {user!r} appears twice in the request")
            seen.add((user, mechanism))
        for user, credential in upsertions:
            if isinstance(credential, KafkaError):
                results.setdefault(user, credential)
        for user, mechanism in deletions:
            if mechanism not in self.credentials.get(user, {}):
                results.setdefault(user, ResourceNotFoundError(f"user {user!r} has no {mechanism} credential"))
        for user in {u for u, _ in [*deletions, *upsertions]}:
            if not user:
                results[user] = UnacceptableCredentialError("a SCRAM credential needs a user name")
            results.setdefault(user, None)
        records: list[MetadataRecord] = [
            RemoveScramCredentialRecord(user, mechanism) for user, mechanism in deletions if results[user] is None
        ]
        records += [ScramCredentialRecord.of(user, c) for user, c in upsertions if results[user] is None]
        return records, results
