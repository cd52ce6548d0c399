"""What `meshbridge shadow` compares, and how it decides: pure values, no I/O.

Each side's latest word about one target is an `Answer`: the normalised endpoint set
plus the *signal* that carried it, because the two documented Linkerd semantics
(Linkerd §1.7, §2.5) say "empty" and "does not exist" differently:

    signal                      proto semantics         linkerd-2.20 semantics
    service has endpoints       add                     add
    service exists, empty       no_endpoints{true}      silence
    endpoints all went away     no_endpoints{true}      remove (every address)
    service does not exist      no_endpoints{false}     Get ends NOT_FOUND
    service deleted             no_endpoints{false}     remove (or silence)

`compare` turns two Answers into a `Verdict`; differences that only the right-hand
column explains are "semantics", never endpoint differences. The `Tracker` keeps one
record per target over time: when agreement was lost, the grace period before a
fresh disagreement counts, and the time both sides took to agree again.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from harness.normalize import NormalEndpoint, State

# ---------------------------------------------------------------------- signals

PENDING: Final = "pending"  # nothing heard yet
ENDPOINTS: Final = "endpoints"  # a non-empty set
EMPTY: Final = "empty"  # xDS: a ClusterLoadAssignment with no endpoints
NO_ENDPOINTS: Final = "no_endpoints{exists:true}"
ABSENT: Final = "no_endpoints{exists:false}"
NOT_FOUND: Final = "NOT_FOUND"
SILENT: Final = "silence"  # Linkerd: stream open, nothing sent within the settle time
REMOVED_ALL: Final = "remove(all)"  # Linkerd: every address removed, no no_endpoints
NO_ANSWER: Final = "no answer"  # xDS SotW: a name never answered (xDS §1.7: absent)
REMOVED: Final = "removed"  # xDS delta: removed_resources (xDS §2: does not exist)
ERROR: Final = "error"  # the stream ended with a status that is no answer

# Which semantics a signal belongs to, when only one of them uses it.
PROTO_SIGNALS: Final = frozenset({NO_ENDPOINTS, ABSENT})
LINKERD_220_SIGNALS: Final = frozenset({NOT_FOUND, SILENT, REMOVED_ALL})

# What a signal says about existence; None: it cannot tell.
_EXISTENCE: Final[Mapping[str, bool | None]] = {
    ENDPOINTS: True, NO_ENDPOINTS: True, ABSENT: False, NOT_FOUND: False,
    # 2.20 sends nothing for a service that exists without endpoints (Linkerd §2.5); a missing
    # one would have ended NOT_FOUND.
    SILENT: True,
    # 2.20 says a deletion only by removing every address (Linkerd §2.5).
    REMOVED_ALL: None,
    EMPTY: None, NO_ANSWER: False, REMOVED: False,
}

# Statuses with which a server answers "this authority is not one I serve": both
# sides saying the same one agree. Anything else (UNAVAILABLE, UNIMPLEMENTED, ...) is
# no answer at all.
REJECTIONS: Final = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED"})

# Every endpoint field but the address, which is how endpoints are matched.
ALL_FIELDS: Final = ("weight", "identity", "hint", "opaque_transport", "zone", "locality",
                     "health")
# What any xDS server's ClusterLoadAssignment carries without meshbridge's metadata.
PLAIN_XDS_FIELDS: Final = ("weight", "zone", "health")


@dataclass(frozen=True, slots=True)
class Answer:
    """One side's latest word about one target."""

    signal: str = PENDING
    endpoints: State = frozenset()
    # What the side says about existence beyond the signal (xDS: its CDS), if anything.
    exists: bool | None = None
    status: str = ""  # "CODE: details" for NOT_FOUND and ERROR
    # This stream once said the target exists: a later ABSENT is a deletion.
    existed: bool = False

    @property
    def existence(self) -> bool | None:
        if self.exists is not None and self.signal in (ENDPOINTS, EMPTY):
            return self.exists
        return _EXISTENCE.get(self.signal)

    @property
    def code(self) -> str:
        return self.status.split(":", 1)[0]

    def describe(self) -> str:
        if self.signal in (ERROR, NOT_FOUND):
            return self.status or self.signal
        if self.signal == ENDPOINTS:
            n = len(self.endpoints)
            return f"{n} endpoint{'' if n == 1 else 's'}"
        if self.signal == EMPTY:
            return {True: "empty (cluster exists)", False: "empty (no cluster)",
                    None: "empty"}[self.exists]
        return self.signal


@dataclass(frozen=True, slots=True)
class Difference:
    kind: str  # only-ours | only-theirs | field | missing | semantics | error
    endpoint: str = ""
    field: str = ""
    ours: str = ""
    theirs: str = ""

    def text(self) -> str:
        if self.kind == "field":
            return f"{self.endpoint} {self.field}: ours {self.ours} != theirs {self.theirs}"
        if self.kind in ("only-ours", "only-theirs"):
            return f"{self.endpoint} only on {self.kind[5:]}"
        return f"{self.kind}: ours {self.ours}, theirs {self.theirs}"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for name in ("endpoint", "field", "ours", "theirs"):
            value = getattr(self, name)
            if value != "":
                out[name] = value
        return out


# Verdict statuses. Agreement is EQUAL or SEMANTICS: the endpoint truth is the same.
EQUAL: Final = "equal"
DIFFERS: Final = "differs"
MISSING: Final = "missing"
SEMANTICS: Final = "semantics"
CONVERGING: Final = "converging"  # shown while a fresh disagreement is within grace
AGREEING: Final = frozenset({EQUAL, SEMANTICS})


@dataclass(frozen=True, slots=True)
class Verdict:
    status: str
    differences: tuple[Difference, ...] = ()
    missing_on: str = ""  # ours | theirs, for MISSING

    @property
    def agrees(self) -> bool:
        return self.status in AGREEING


def _value(ep: NormalEndpoint, name: str) -> str:
    return str(getattr(ep, name))


def endpoint_differences(ours: State, theirs: State,
                         fields: Iterable[str] = ALL_FIELDS) -> list[Difference]:
    """Endpoints matched by address: those only one side has, and for the rest each
    compared field that differs."""
    by_o = {(e.address, e.port): e for e in ours}
    by_t = {(e.address, e.port): e for e in theirs}
    out: list[Difference] = []
    for key in sorted(by_o.keys() | by_t.keys()):
        o, t = by_o.get(key), by_t.get(key)
        if t is None:
            assert o is not None
            out.append(Difference("only-ours", o.addr))
        elif o is None:
            out.append(Difference("only-theirs", t.addr))
        else:
            out.extend(Difference("field", o.addr, name, _value(o, name), _value(t, name))
                       for name in fields if getattr(o, name) != getattr(t, name))
    return out


def _semantics_pair(a: Answer, b: Answer) -> bool:
    return ((a.signal in PROTO_SIGNALS and b.signal in LINKERD_220_SIGNALS)
            or (b.signal in PROTO_SIGNALS and a.signal in LINKERD_220_SIGNALS))


def _compatible(a: Answer, b: Answer) -> bool:
    """Existence does not contradict, allowing for what each semantics cannot say."""
    ea, eb = a.existence, b.existence
    if ea is None or eb is None or ea == eb:
        return True
    # 2.20 stays silent when an endpoint-less service is deleted (Linkerd §2.5): proto's
    # no_endpoints{false} after it said the service existed is that same deletion.
    return any(x.signal == ABSENT and x.existed and y.signal == SILENT
               for x, y in ((a, b), (b, a)))


def compare(ours: Answer, theirs: Answer, fields: Iterable[str] = ALL_FIELDS) -> Verdict:
    fields = tuple(fields)
    errors = [(side, ans) for side, ans in (("ours", ours), ("theirs", theirs))
              if ans.signal == ERROR]
    if errors:
        if (len(errors) == 2 and ours.code == theirs.code and ours.code in REJECTIONS):
            return Verdict(EQUAL)  # both reject the authority alike
        return Verdict(ERROR, (Difference("error", ours=ours.describe(),
                                          theirs=theirs.describe()),))
    if PENDING in (ours.signal, theirs.signal):
        return Verdict(PENDING)
    if not _compatible(ours, theirs):
        side = "ours" if ours.existence is False else "theirs"
        return Verdict(MISSING, (Difference("missing", ours=ours.describe(),
                                            theirs=theirs.describe()),), side)
    diffs = endpoint_differences(ours.endpoints, theirs.endpoints, fields)
    if diffs:
        return Verdict(DIFFERS, tuple(diffs))
    if ours.signal != theirs.signal and _semantics_pair(ours, theirs):
        return Verdict(SEMANTICS, (Difference("semantics", ours=ours.signal,
                                              theirs=theirs.signal),))
    return Verdict(EQUAL)


# ---------------------------------------------------------------------- over time


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened to one target, as reported (`--json`: one line)."""

    target: str
    status: str  # shown status: a verdict status or CONVERGING
    previous: str
    differences: tuple[Difference, ...] = ()
    time_to_agree: float | None = None  # seconds, when agreement came back
    changed: str = ""  # which side's answer changed: ours | theirs
    missing_on: str = ""  # for MISSING: ours | theirs
    ours: str = ""
    theirs: str = ""
    at: float = 0.0  # wall clock

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "event": "target", "at": round(self.at, 3), "target": self.target,
            "status": self.status, "previous": self.previous,
            "ours": self.ours, "theirs": self.theirs,
        }
        if self.changed:
            out["changed"] = self.changed
        if self.missing_on:
            out["missing_on"] = self.missing_on
        if self.differences:
            out["differences"] = [d.as_json() for d in self.differences]
        if self.time_to_agree is not None:
            out["time_to_agree_ms"] = round(self.time_to_agree * 1000, 1)
        return out


@dataclass(slots=True)
class Record:
    target: str
    ours: Answer = field(default_factory=Answer)
    theirs: Answer = field(default_factory=Answer)
    verdict: Verdict = field(default_factory=lambda: Verdict(PENDING))
    shown: str = PENDING
    # Monotonic time agreement was lost (or first compared without agreeing).
    since: float | None = None
    changed_at: float = 0.0
    agreed_after: list[float] = field(default_factory=list)  # every time-to-agree


class Tracker:
    """One record per target; feeds answers in, gets events out.

    A disagreement shows as CONVERGING until `grace` seconds have passed since the
    last change on either side (the other side may simply not have caught up yet),
    then as its verdict. Errors show at once. When the sides agree again, the time
    since agreement was lost is reported.
    """

    def __init__(self, grace: float, fields: Iterable[str] = ALL_FIELDS) -> None:
        self.grace = grace
        self.fields = tuple(fields)
        self.records: dict[str, Record] = {}

    def add(self, target: str) -> bool:
        if target in self.records:
            return False
        self.records[target] = Record(target)
        return True

    def set_fields(self, fields: Iterable[str], now: float) -> list[Event]:
        fields = tuple(f for f in ALL_FIELDS if f in set(fields))
        if fields == self.fields:
            return []
        self.fields = fields
        out: list[Event] = []
        for rec in self.records.values():
            out.extend(self._evaluate(rec, now, ""))
        return out

    def set_answer(self, target: str, side: str, answer: Answer, now: float) -> list[Event]:
        rec = self.records.get(target)
        if rec is None:
            self.add(target)
            rec = self.records[target]
        if getattr(rec, side) == answer:
            return []
        setattr(rec, side, answer)
        rec.changed_at = now
        return self._evaluate(rec, now, side)

    def tick(self, now: float) -> list[Event]:
        """Disagreements whose grace has run out now show as what they are."""
        out: list[Event] = []
        for rec in self.records.values():
            if rec.shown == CONVERGING and now - rec.changed_at >= self.grace:
                out.extend(self._evaluate(rec, now, ""))
        return out

    def converging(self) -> int:
        return sum(1 for r in self.records.values() if r.shown == CONVERGING)

    def _evaluate(self, rec: Record, now: float, changed: str) -> list[Event]:
        old_shown, old_verdict = rec.shown, rec.verdict
        v = compare(rec.ours, rec.theirs, self.fields)
        rec.verdict = v
        agreed: float | None = None
        if v.agrees:
            if rec.since is not None:
                agreed = now - rec.since
                rec.agreed_after.append(agreed)
                rec.since = None
            shown = v.status
        elif v.status == PENDING:
            shown = PENDING
        else:
            if rec.since is None:
                rec.since = rec.changed_at if changed else now
            fresh = now - rec.changed_at < self.grace
            shown = CONVERGING if fresh and v.status != ERROR else v.status
        rec.shown = shown
        if shown == old_shown and agreed is None and (
                shown == CONVERGING or v.differences == old_verdict.differences):
            return []
        return [Event(rec.target, shown, old_shown,
                      () if shown == CONVERGING else v.differences,
                      agreed, changed, v.missing_on if shown == MISSING else "",
                      rec.ours.describe(), rec.theirs.describe(), time.time())]

    def unagreed(self) -> list[Record]:
        return [r for r in self.records.values() if not r.verdict.agrees]
