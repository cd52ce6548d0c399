"""`--workers N|auto` (docs/workers.md): the count a user may ask for, and the one-line
refusal naming the limit otherwise."""

from __future__ import annotations

import pytest

from meshbridge.workers.cores import parse_workers


def test_auto_is_every_usable_core_and_a_number_up_to_them_is_taken() -> None:
    assert parse_workers("auto", cores=4) == 4
    assert parse_workers(" AUTO ", cores=1) == 1
    assert [parse_workers(str(n), cores=4) for n in (1, 2, 4)] == [1, 2, 4]


@pytest.mark.parametrize(("text", "why"), [
    ("0", "--workers 0: this process may use 2 cores (os.sched_getaffinity); use 1..2 "
          "or auto"),
    ("3", "--workers 3: this process may use 2 cores (os.sched_getaffinity); use 1..2 "
          "or auto"),
    ("-1", "--workers -1: this process may use 2 cores (os.sched_getaffinity); use 1..2 "
           "or auto"),
    ("two", "--workers two: not a number; this process may use 2 cores "
            "(os.sched_getaffinity); use 1..2 or auto"),
])
def test_a_count_out_of_range_or_not_a_number_is_refused_naming_the_limit(
        text: str, why: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_workers(text, cores=2)
    assert str(e.value) == why


def test_one_core_is_said_in_the_singular() -> None:
    with pytest.raises(ValueError, match=r"may use 1 core \(os"):
        parse_workers("2", cores=1)
