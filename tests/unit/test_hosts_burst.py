"""The token bucket a limited link of the test hosts gets (tests/support/hosts.py): big
enough for the rate, since tbf refills it once a kernel tick and a small one holds a fast
link below its rate (32 KiB at HZ 1000: about 260 mbit/s, whatever the limit says)."""

from __future__ import annotations

import pytest

from tests.support.hosts import tbf_burst


@pytest.mark.parametrize(
    ("rate", "burst"),
    [
        ("4mbit", 32 * 1024),  # slow links keep tc's 32 kB
        ("32mbit", 40_000),
        ("1gbit", 1_250_000),  # what 1 gbit/s carries in 10 ms (a tick at HZ 100)
        ("1Gbit", 1_250_000),
        ("10mbps", 100_000),  # bytes a second
        ("2.5gbit", 3_125_000),
        ("1gibit", 1_342_178),
        ("100000000", 125_000),  # a bare number: bits a second
    ],
)
def test_the_bucket_holds_what_the_link_carries_in_10_ms(rate: str, burst: int) -> None:
    assert tbf_burst(rate) == burst


@pytest.mark.parametrize("rate", ["fast", "1 gbit", "1xbit", ""])
def test_a_rate_tc_would_not_read_is_an_error_naming_it(rate: str) -> None:
    with pytest.raises(ValueError, match="expected tc's units"):
        tbf_burst(rate)
