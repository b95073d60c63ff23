"""Event ids: where a stream is, written so that any web process can resume from it alone.

- An evaluation's: ``T.R.O``, the transitions, test results and log bytes sent so far.
- A batch's: one entry per evaluation in queue order, ``T.R`` or ``d`` (it ended and all of
  it was sent), run-length encoded (``d*40,7.2,1.0*59``): a batch of 1000 evaluations, every
  one at a different count, is still far below gunicorn's 8190-byte header line.
- ``done``, the id of the last event: a client reconnecting with it is told to stop (204).

Counts, not row ids: transitions of one evaluation are inserted one after another commit (each
UPDATE of the evaluation's row waits for the previous one's commit), so their id order is commit
order, and test results are inserted once, together; "the first N" never gains a row in the middle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DONE = "done"
ENDED = "d"  # in a batch cursor: an evaluation that ended, everything of it sent
_EVAL = re.compile(r"^([0-9]{1,15})\.([0-9]{1,15})\.([0-9]{1,15})$")
_ENTRY = re.compile(r"^(d|[0-9]{1,15}\.[0-9]{1,15})(?:\*([0-9]{1,6}))?$")


class BadCursor(ValueError):
    pass


@dataclass
class Position:
    """How much of one evaluation a stream has sent."""

    transitions: int = 0
    tests: int = 0
    log: int = 0
    ended: bool = False

    def entry(self) -> str:
        return ENDED if self.ended else f"{self.transitions}.{self.tests}"


def evaluation_id(position: Position) -> str:
    return f"{position.transitions}.{position.tests}.{position.log}"


def parse_evaluation(raw: str) -> Position:
    found = _EVAL.match(raw)
    if not found:
        raise BadCursor("an evaluation's event id is three counts, T.R.O (transitions, tests, log bytes)")
    return Position(int(found[1]), int(found[2]), int(found[3]))


def batch_id(positions: list[Position]) -> str:
    runs: list[list] = []
    for position in positions:
        entry = position.entry()
        if runs and runs[-1][0] == entry:
            runs[-1][1] += 1
        else:
            runs.append([entry, 1])
    return ",".join(entry if count == 1 else f"{entry}*{count}" for entry, count in runs)


def parse_batch(raw: str, evaluations: int) -> list[Position]:
    positions: list[Position] = []
    for part in raw.split(","):
        found = _ENTRY.match(part)
        if not found or found[2] == "0":
            raise BadCursor("a batch's event id is comma-separated entries T.R or d, each optionally *N")
        count = int(found[2] or 1)
        if len(positions) + count > evaluations:
            raise BadCursor(f"a batch's event id has one entry per evaluation of the batch ({evaluations})")
        for _ in range(count):
            if found[1] == ENDED:
                positions.append(Position(ended=True))
            else:
                transitions, tests = found[1].split(".")
                positions.append(Position(int(transitions), int(tests)))
    if len(positions) != evaluations:
        raise BadCursor(f"a batch's event id has one entry per evaluation of the batch ({evaluations})")
    return positions
