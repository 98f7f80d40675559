"""ScramControlManager alone: AlterUserScramCredentials planned as records, replayed, imaged."""

from __future__ import annotations

from rayk.errors import DuplicateResourceError, ResourceNotFoundError, UnacceptableCredentialError
from rayk.metadata.records import pack, unpack
from rayk.metadata.scram_control import ScramControlManager
from rayk.scram import credential_from_password
from tests.metadata_helpers import replay_into

ALICE_512 = credential_from_password("SCRAM-SHA-512", "a", 4096)
ALICE_256 = credential_from_password("SCRAM-SHA-256", "a", 4096)


def test_credentials_are_set_removed_and_a_bad_user_changes_nothing_of_its_own():
    scram = ScramControlManager()
    records, results = scram.plan_alter([], [("alice", ALICE_512), ("alice", ALICE_256)])
    assert results == {"alice": None}
    offset = replay_into(scram, records)
    records, results = scram.plan_alter(
        [("alice", "SCRAM-SHA-256"), ("bob", "SCRAM-SHA-512"), ("carol", "SCRAM-SHA-512")],
        [("carol", credential_from_password("SCRAM-SHA-512", "c", 4096)), ("", ALICE_512),
         ("dave", UnacceptableCredentialError("iterations"))],
    )
    assert results["alice"] is None
    assert isinstance(results["bob"], ResourceNotFoundError)
    assert isinstance(results["carol"], DuplicateResourceError)  # deleted and set in one request
    assert isinstance(results[""], UnacceptableCredentialError) and isinstance(results["dave"], UnacceptableCredentialError)
    offset = replay_into(scram, records, offset)
    assert scram.credentials == {"alice": {"SCRAM-SHA-512": ALICE_512}}
    replay_into(scram, scram.plan_alter([("alice", "SCRAM-SHA-512")], [])[0], offset)
    assert scram.credentials == {}, "a user without credentials is gone"


def test_describe_names_mechanisms_and_iterations_never_keys():
    scram = ScramControlManager()
    replay_into(scram, scram.plan_alter([], [("alice", ALICE_512)])[0])
    described = scram.describe(None)
    assert described == {"alice": [("SCRAM-SHA-512", 4096)]}
    assert isinstance(scram.describe(["bob"])["bob"], ResourceNotFoundError)


def test_the_image_through_msgpack_keeps_salts_and_keys():
    scram = ScramControlManager()
    replay_into(scram, scram.plan_alter([], [("alice", ALICE_512), ("bob", ALICE_256)])[0])
    again = ScramControlManager()
    replay_into(again, [unpack(pack(r)) for r in scram.image_records()])
    assert again.credentials == scram.credentials
