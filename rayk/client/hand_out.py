"""HandOut: the consumer's records handed out one at a time, each moving its partition's
position past itself (`for record in consumer`, and Fetcher.hand_out).

The loop is compiled (rayk/client/_hand_out.c, whose top comment gives the contract): it
hands a fetched chunk's records out with no Python frame per record, asking a generator
(the consumer's, or the fetcher's) for the next chunk when one is done or was overtaken
by a seek, a poll, a pause or a close. `hand_out_reference` is the same in Python: the
reference the tests hold the compiled one to, and what runs where no C compiler was
found at install.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from typing import Any


def hand_out_reference(source: Generator[Any, int | None, None], positions: dict[Any, int], fetcher: Any) -> Iterator[Any]:
    """The compiled HandOut in Python (same arguments, same records, positions and calls)."""
    handed: int | None = None
    while True:
        try:
            chunk = source.send(handed)
        except StopIteration:
            return
        handed = 0
        tp, records, end, changes = chunk.tp, chunk.records, chunk.end, fetcher._changes
        position = positions[tp]
        popleft = records.popleft
        while True:
            before_undecodable = False  # the record left is followed by a batch that does not decode
            if len(records) <= 1 and chunk.more:  # whether the next record is the chunk's last is not known yet
                try:
                    fetcher.decode_more(chunk)
                    if positions.get(tp) != position or fetcher._changes != changes:
                        break  # a seek or a forget in a deserializer: the chunk is left
                    continue
                except Exception:
                    if not records:
                        raise
                    before_undecodable = True  # it goes out first; the next step, with none left, meets the error
            if not records:  # past a tail of control batches; done with the chunk
                position = positions[tp] = max(position, end)
                fetcher._drop_if_first(chunk)
                break
            record = popleft()
            offset = record[2]  # ConsumerRecord.offset
            if offset < position:
                continue  # a batch that starts before the position
            if records or before_undecodable:
                position = positions[tp] = offset + 1
            else:  # the chunk's last record: past its tail of control batches
                position = positions[tp] = max(offset + 1, end)
                fetcher._drop_if_first(chunk)  # so its partition's next fetch may go out at once
            handed += 1
            yield record
            if positions.get(tp) != position or fetcher._changes != changes:
                break  # a seek, a poll in between, an unassignment, a forget or the close


try:
    from rayk.client._hand_out import HandOut  # built from _hand_out.c by pip install
except ImportError:  # installed where no C compiler was found: the same loop, slower
    logging.getLogger(__name__).warning(
        "rayk.client._hand_out is not built (no C compiler at install time?); the consumer's iteration runs in Python"
    )
    HandOut = hand_out_reference
