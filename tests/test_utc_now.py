"""``utc_now`` writes the text ``datetime.now(UTC).isoformat(timespec="milliseconds")`` writes, to the character."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.ledger import utc_now
from harness.ledger.records import iso_utc

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _by_datetime(ns: int) -> str:
    """What ``datetime.now`` gives at clock ``ns``: floored to microseconds, then ``isoformat`` to milliseconds."""
    return (EPOCH + timedelta(microseconds=ns // 1000)).isoformat(timespec="milliseconds")


@settings(max_examples=500, deadline=None)
@given(st.integers(min_value=0, max_value=4_102_444_800 * 10**9))  # up to 2100
def test_iso_utc_is_datetimes_text(ns):
    assert iso_utc(ns) == _by_datetime(ns)


def test_iso_utc_within_one_second_and_across_seconds():
    base = 1_764_650_000 * 10**9
    for ns in (base, base + 999_999_999, base + 10**9, base + 1, base - 1, base + 123_456_789, base):
        assert iso_utc(ns) == _by_datetime(ns), ns


def test_utc_now_reads_the_clock_between_two_datetime_readings():
    before = datetime.now(UTC).isoformat(timespec="milliseconds")
    now = utc_now()
    after = datetime.now(UTC).isoformat(timespec="milliseconds")
    assert before <= now <= after and len(now) == len(before) and now.endswith("+00:00")
