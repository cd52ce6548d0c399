"""A ServiceProfile's spec, read once into frozen values (Linkerd §2.8): its routes
(request conditions, response classes, isRetryable, timeout), its retry budget and
its `dstOverrides`.

The one reader of a ServiceProfile: the Linkerd layer encodes GetProfile's
`DestinationProfile` from these values, and the route model (`profile_routes`)
turns the same values into the Service port's routes for every other client, so
that the two cannot read one profile differently. A spec that cannot be read raises
`ProfileError` naming the field: Linkerd drops such a profile whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

MAX_WEIGHT = 2**32  # a dstOverride's weight must fit the proto's uint32


class ProfileError(ValueError):
    """A ServiceProfile that cannot be converted; the message names the field."""


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class RequestCondition:
    """A route's request condition, as Linkerd builds it (§2.8): `all`, `any` and
    `not` hold `items`; `method` (upper-cased) and `path` (a regex) hold `value`."""

    kind: str  # "all" | "any" | "not" | "method" | "path"
    value: str = ""
    items: tuple[RequestCondition, ...] = ()


@dataclass(frozen=True, slots=True)
class ResponseCondition:
    """A response class's condition: `all`, `any`, `not` over `items`, or a status
    range (`low`/`high`, 0 meaning open on that side)."""

    kind: str  # "all" | "any" | "not" | "status"
    low: int = 0
    high: int = 0
    items: tuple[ResponseCondition, ...] = ()

    def matches(self, status: int) -> bool:
        if self.kind == "status":
            return (not self.low or status >= self.low) and (not self.high or status <= self.high)
        if self.kind == "all":
            return all(c.matches(status) for c in self.items)
        if self.kind == "any":
            return any(c.matches(status) for c in self.items)
        return not self.items[0].matches(status)


@dataclass(frozen=True, slots=True)
class ResponseClass:
    condition: ResponseCondition
    is_failure: bool


@dataclass(frozen=True, slots=True)
class ProfileRoute:
    name: str
    condition: RequestCondition
    response_classes: tuple[ResponseClass, ...]
    is_retryable: bool
    timeout_ns: int  # 0: none
    timeout_problem: str = ""  # why a timeout that was written is not used


@dataclass(frozen=True, slots=True)
class RetryBudget:
    ratio: float
    min_per_second: int
    ttl_ns: int


# Linkerd's default retry budget (§2.8): 20% extra load, 10 retries/s, 10 s window.
DEFAULT_RETRY_BUDGET = RetryBudget(0.2, 10, 10_000_000_000)


@dataclass(frozen=True, slots=True)
class DstOverride:
    authority: str  # as written
    weight: int  # Linkerd's: the quantity in thousandths, times ten

    def authority_for(self, port: int) -> str:
        """The authority a client of `port` is sent to: one without a port gets the
        requested port (§2.8)."""
        return self.authority if go_split_host_port_ok(self.authority) \
            else f"{self.authority}:{port}"


@dataclass(frozen=True, slots=True)
class Profile:
    routes: tuple[ProfileRoute, ...]
    retry_budget: RetryBudget
    dst_overrides: tuple[DstOverride, ...]


# --------------------------------------------------------------------------- value parsers

_GO_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000,
             "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_GO_COMPONENT = re.compile(r"([0-9]*(?:\.[0-9]*)?)([a-zµμ]+)")


def parse_go_duration(text: str) -> int:
    """Nanoseconds of a Go duration string (`300ms`, `1.5s`, `1h30m`, `0`).

    Go's time.ParseDuration grammar; a negative duration is refused, because no
    timeout or retry window can be negative.
    """
    s = text.strip()
    if s == "0":
        return 0
    if s.startswith("-"):
        raise ProfileError(f"duration {text!r} is negative")
    s = s.removeprefix("+")
    if not s:
        raise ProfileError(f"invalid duration {text!r}")
    total = Decimal(0)
    pos = 0
    while pos < len(s):
        m = _GO_COMPONENT.match(s, pos)
        if m is None or m.group(1) in ("", "."):
            raise ProfileError(f"invalid duration {text!r}")
        unit = _GO_UNITS.get(m.group(2))
        if unit is None:
            raise ProfileError(f"unknown unit {m.group(2)!r} in duration {text!r}")
        total += Decimal(m.group(1)) * unit
        pos = m.end()
    return int(total)


_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?")
_SUFFIX = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
           "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
           "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
           "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
           "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60)}


def quantity_milli_value(raw: Any) -> int:
    """A Kubernetes quantity (`1`, `500m`, `0.5`, `1k`) in thousandths, rounded up as
    resource.Quantity.MilliValue rounds."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ProfileError(f"weight {raw!r} is not a quantity")
    text = str(raw).strip()
    m = _QUANTITY.fullmatch(text)
    if m is None:
        raise ProfileError(f"weight {raw!r} is not a quantity")
    try:
        number = Decimal(m.group(1))
        suffix = m.group(2) or ""
        if suffix[:1] in ("e", "E"):
            number = number.scaleb(int(suffix[1:]))
        else:
            number *= _SUFFIX[suffix]
        milli = (number * 1000).to_integral_value(rounding=ROUND_CEILING)
    except (InvalidOperation, ValueError):
        raise ProfileError(f"weight {raw!r} is not a quantity") from None
    return int(milli)


def go_split_host_port_ok(text: str) -> bool:
    """Whether Go's net.SplitHostPort accepts `text` (the port need not be numeric)."""
    if text.startswith("["):
        end = text.find("]")
        return end > 0 and text[end + 1:end + 2] == ":" and ":" not in text[end + 2:]
    return text.count(":") == 1 and "[" not in text and "]" not in text


# --------------------------------------------------------------------------- conditions


def _mapping(raw: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where} must be a mapping, got {raw!r}")
    return raw


def _seq(raw: Any, where: str) -> list[Any]:
    if not isinstance(raw, list):
        raise ProfileError(f"{where} must be a list, got {raw!r}")
    return raw


def _string(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise ProfileError(f"{where} must be a string, got {raw!r}")
    return raw


def _one_or_all(kind: str, found: list[Any], where: str) -> Any:
    if not found:
        raise ProfileError(f"{where} must set at least one field")
    return found[0] if len(found) == 1 else type(found[0])(kind, items=tuple(found))


def request_condition(raw: Any, where: str = "condition") -> RequestCondition:
    """Linkerd's ToRequestMatch: sub-conditions in the order all, any, method, not,
    pathRegex; one stands alone, several are wrapped in `all`."""
    rm = _mapping(raw, where)
    found: list[RequestCondition] = []
    for key in ("all", "any"):
        if rm.get(key) is not None:
            found.append(RequestCondition(key, items=tuple(
                request_condition(m, f"{where}.{key}[{i}]")
                for i, m in enumerate(_seq(rm[key], f"{where}.{key}")))))
    if rm.get("method"):
        found.append(RequestCondition("method", _string(rm["method"], f"{where}.method").upper()))
    if rm.get("not") is not None:
        found.append(RequestCondition("not", items=(request_condition(rm["not"],
                                                                      f"{where}.not"),)))
    if rm.get("pathRegex"):
        found.append(RequestCondition("path", _string(rm["pathRegex"], f"{where}.pathRegex")))
    result: RequestCondition = _one_or_all("all", found, where)
    return result


def response_condition(raw: Any, where: str = "condition") -> ResponseCondition:
    """Linkerd's ToResponseMatch: all, any, status, not; statuses are 0 or 100..599."""
    rm = _mapping(raw, where)
    found: list[ResponseCondition] = []
    for key in ("all", "any"):
        if rm.get(key) is not None:
            found.append(ResponseCondition(key, items=tuple(
                response_condition(m, f"{where}.{key}[{i}]")
                for i, m in enumerate(_seq(rm[key], f"{where}.{key}")))))
    if rm.get("status") is not None:
        status = _mapping(rm["status"], f"{where}.status")
        lo, hi = (_status(status.get(k, 0), f"{where}.status.{k}") for k in ("min", "max"))
        if lo and hi and hi < lo:
            raise ProfileError(f"{where}.status: max {hi} is below min {lo}")
        found.append(ResponseCondition("status", lo, hi))
    if rm.get("not") is not None:
        found.append(ResponseCondition("not", items=(response_condition(rm["not"],
                                                                        f"{where}.not"),)))
    result: ResponseCondition = _one_or_all("all", found, where)
    return result


def _status(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ProfileError(f"{where} must be an HTTP status, got {raw!r}")
    if raw != 0 and not 100 <= raw <= 599:
        raise ProfileError(f"{where} {raw} is not an HTTP status (100-599)")
    return raw


def _flag(raw: Any, where: str) -> bool:
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise ProfileError(f"{where} must be true or false, got {raw!r}")
    return raw


# --------------------------------------------------------------------------- the profile


def decode_profile(spec: Mapping[str, Any]) -> Profile:
    """A ServiceProfile's spec as values; ProfileError names what cannot be read."""
    routes = tuple(_route(raw, f"spec.routes[{i}]")
                   for i, raw in enumerate(_seq(spec.get("routes") or [], "spec.routes")))
    overrides = tuple(_dst_override(raw, f"spec.dstOverrides[{i}]")
                      for i, raw in enumerate(_seq(spec.get("dstOverrides") or [],
                                                   "spec.dstOverrides")))
    return Profile(routes, _retry_budget(spec.get("retryBudget")), overrides)


def _route(raw: Any, where: str) -> ProfileRoute:
    r = _mapping(raw, where)
    name = _string(r.get("name", ""), f"{where}.name")
    if r.get("condition") is None:
        raise ProfileError(f"{where}.condition is missing")
    condition = request_condition(r["condition"], f"{where}.condition")
    classes = []
    for i, rc_raw in enumerate(_seq(r.get("responseClasses") or [],
                                    f"{where}.responseClasses")):
        rc = _mapping(rc_raw, f"{where}.responseClasses[{i}]")
        if rc.get("condition") is None:
            raise ProfileError(f"{where}.responseClasses[{i}].condition is missing")
        classes.append(ResponseClass(
            response_condition(rc["condition"], f"{where}.responseClasses[{i}].condition"),
            _flag(rc.get("isFailure"), f"{where}.responseClasses[{i}].isFailure")))
    retryable = _flag(r.get("isRetryable"), f"{where}.isRetryable")
    timeout, problem = 0, ""
    raw_timeout = r.get("timeout")
    if raw_timeout not in (None, ""):
        # A bad timeout is left unset and reported; the rest of the route stands (§2.8).
        try:
            timeout = parse_go_duration(_string(raw_timeout, f"{where}.timeout"))
        except ProfileError as e:
            problem = str(e)
    return ProfileRoute(name, condition, tuple(classes), retryable, timeout, problem)


def _retry_budget(raw: Any) -> RetryBudget:
    if raw is None:
        return DEFAULT_RETRY_BUDGET
    rb = _mapping(raw, "spec.retryBudget")
    ratio = rb.get("retryRatio", 0)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio < 0:
        raise ProfileError(f"spec.retryBudget.retryRatio must be a number >= 0, got {ratio!r}")
    per_second = rb.get("minRetriesPerSecond", 0)
    if isinstance(per_second, bool) or not isinstance(per_second, int) \
            or not 0 <= per_second < 2**32:
        raise ProfileError("spec.retryBudget.minRetriesPerSecond must be a whole number >= 0,"
                           f" got {per_second!r}")
    ttl = parse_go_duration(_string(rb.get("ttl", ""), "spec.retryBudget.ttl"))
    return RetryBudget(float(ratio), per_second, ttl)


def _dst_override(raw: Any, where: str) -> DstOverride:
    d = _mapping(raw, where)
    authority = _string(d.get("authority"), f"{where}.authority")
    weight = quantity_milli_value(d.get("weight")) * 10
    if not 0 <= weight < MAX_WEIGHT:
        raise ProfileError(f"{where}.weight {d.get('weight')!r} is out of range")
    return DstOverride(authority, weight)
