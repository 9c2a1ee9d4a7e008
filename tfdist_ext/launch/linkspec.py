"""Parsing of the launcher's link options: `--link-bandwidth` and `--link-latency` (pure)."""

import re
import types

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|[kmgt]i?bit|bps|[kmgt]i?bps)$")
_SCALE = types.MappingProxyType({"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
                                  "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40})


def parse_rate(text: str) -> float:
    """Bits per second of a tc rate such as '50mbit', '1gbit', '100kbit', '10mbps'.

    Raises:
        ValueError: naming the text received and the accepted forms.
    """
    match = _RATE.match(text.strip().lower())
    bps = 0.0
    if match:
        unit = match.group(2)
        bps = float(match.group(1)) * _SCALE[unit[:-3]] * (8 if unit.endswith("bps") else 1)
    if bps < 8000:
        raise ValueError(
            f"must be a tc rate of at least 8kbit such as 100kbit, 50mbit, 1gbit or 10mbps "
            f"(units: bit, kbit, mbit, gbit, tbit, *ibit, bps, kbps, mbps, gbps); "
            f"received {text!r}")
    return bps


_DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")


def parse_delay(text: str) -> float:
    """Seconds of a delay such as '50ms', '500us' or '1s'.

    Raises:
        ValueError: naming the text received and the accepted forms.
    """
    match = _DELAY.match(text.strip().lower())
    if not match:
        raise ValueError(f"must be a delay such as 50ms, 500us or 1s; received {text!r}")
    return float(match.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[match.group(2)]


def parse_latency(text: str):
    """A `--link-latency` value: one delay for every pair ('50ms' -> 0.05), or delays
    per host pair ('0:1=100ms,0:2=30ms' -> {(0, 1): 0.1, (0, 2): 0.03}; pairs not
    listed get none).

    Raises:
        ValueError: naming the text received and the accepted forms.
    """
    if "=" not in text:
        return parse_delay(text)
    pairs = {}
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*=\s*(\S+)\s*", item)
        if not match or match.group(1) == match.group(2):
            raise ValueError(
                f"must be a delay such as 50ms, or delays per pair of hosts such as "
                f"0:1=100ms,0:2=30ms (host indices, two different ones per pair); "
                f"received {text!r}")
        pair = tuple(sorted((int(match.group(1)), int(match.group(2)))))
        pairs[pair] = parse_delay(match.group(3))
    return pairs
