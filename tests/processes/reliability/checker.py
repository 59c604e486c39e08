"""A Jepsen-style checker: classify every acknowledged job as executed once, lost or duplicated."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    acknowledged: int  # enqueue returned: the job was committed
    executed: int  # distinct jobs whose handler reached its end at least once
    lost: int  # acknowledged, never executed
    duplicated: int  # executed more than once
    unexpected: int  # executed, never acknowledged

    def __str__(self) -> str:
        return (
            f"{self.acknowledged} acknowledged, {self.executed} executed, {self.lost} lost, "
            f"{self.duplicated} duplicated, {self.unexpected} unexpected"
        )


def check(acknowledged: Iterable[uuid.UUID], executions: Iterable[uuid.UUID]) -> Verdict:
    """``executions``: one id per completed run of a handler (a side-effect row each)."""
    sent = set(acknowledged)
    runs = Counter(executions)
    return Verdict(
        acknowledged=len(sent),
        executed=len(runs),
        lost=len(sent - set(runs)),
        duplicated=sum(1 for count in runs.values() if count > 1),
        unexpected=len(set(runs) - sent),
    )
