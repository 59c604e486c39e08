import uuid

from tests.processes.reliability.checker import check


def test_the_checker_classifies_each_case() -> None:
    a, b, c, d = (uuid.uuid4() for _ in range(4))
    verdict = check([a, b, c], [a, b, b, d])
    assert (verdict.lost, verdict.duplicated, verdict.unexpected) == (1, 1, 1)
    assert (verdict.acknowledged, verdict.executed) == (3, 3)
