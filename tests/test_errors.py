"""rayk.errors: what an error keeps when it travels (pickled, as Ray carries it) and its bounds."""

from __future__ import annotations

import pickle

from rayk.errors import MAX_RECORD_ERRORS, InvalidRecordError, RecordError


def test_an_invalid_record_error_keeps_its_record_errors_across_pickling():
    named = [RecordError(3, "no key"), RecordError(7, "no key")]
    error = InvalidRecordError("2 records have no key", record_errors=named)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is InvalidRecordError and str(again) == str(error)
    assert again.record_errors == (RecordError(3, "no key"), RecordError(7, "no key"))


def test_an_invalid_record_error_names_at_most_max_record_errors():
    named = (RecordError(i, "no key") for i in range(MAX_RECORD_ERRORS + 5))
    error = InvalidRecordError("all keyless", record_errors=named)
    assert [e.batch_index for e in error.record_errors] == list(range(MAX_RECORD_ERRORS))
