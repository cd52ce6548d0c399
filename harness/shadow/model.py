"""What `meshbridge shadow` compares, and how it decides: pure values, no I/O.

Each side's latest word about one target is an `Answer`: every field of its endpoints,
of the set (or CLA), of its profile and (`--routes`) of its routes, flattened to field
paths (`harness.shadow.flat`, `harness.shadow.routes`),
its stream's message counts, and the *signal* that carried it, because the two
documented Linkerd semantics (Linkerd §1.7, §2.5) say "empty" and "does not exist" differently:

    signal                      proto semantics         linkerd-2.20 semantics
    service has endpoints       add                     add
    service exists, empty       no_endpoints{true}      silence
    endpoints all went away     no_endpoints{true}      remove (every address)
    service does not exist      no_endpoints{false}     Get ends NOT_FOUND
    service deleted             no_endpoints{false}     remove (or silence)

A Linkerd `add` with no addresses while none are known is what it is, `add(empty)`.

`compare` turns two Answers into a `Verdict`; differences that only the right-hand
column explains are "semantics", never endpoint differences. The `Tracker` keeps one
record per target over time: when agreement was lost, the grace period before a
fresh disagreement counts, and the time both sides took to agree again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from harness.shadow.fields import NOTHING, UNSET, FieldFilter

# ---------------------------------------------------------------------- signals

PENDING: Final = "pending"  # nothing heard yet
ENDPOINTS: Final = "endpoints"  # a non-empty set
EMPTY: Final = "empty"  # xDS: a ClusterLoadAssignment with no endpoints
NO_ENDPOINTS: Final = "no_endpoints{exists:true}"
ABSENT: Final = "no_endpoints{exists:false}"
NOT_FOUND: Final = "NOT_FOUND"
SILENT: Final = "silence"  # Linkerd: stream open, nothing sent within the settle time
REMOVED_ALL: Final = "remove(all)"  # Linkerd: every address removed, no no_endpoints
EMPTY_ADD: Final = "add(empty)"  # Linkerd: an add with no addresses, and none known
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
    EMPTY_ADD: None,
    EMPTY: None, NO_ANSWER: False, REMOVED: False,
}

# Statuses with which a server answers "this authority is not one I serve": both
# sides saying the same one agree. Anything else (UNAVAILABLE, UNIMPLEMENTED, ...) is
# no answer at all.
REJECTIONS: Final = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED"})

# The message counters compared (`messages.<name>`); the others are only reported.
COMPARED_COUNTERS: Final = ("redundant", "profile_redundant")

FlatEndpoints = Mapping[str, Mapping[str, str]]  # endpoint key -> path below it -> value


@dataclass(frozen=True, slots=True)
class Answer:
    """One side's latest word about one target: the signal that carried it, and every
    field as `path -> value` (`harness.shadow.fields`)."""

    signal: str = PENDING
    endpoints: FlatEndpoints = dataclasses.field(default_factory=dict)
    # What the side says about existence beyond the signal (xDS: its CDS), if anything.
    exists: bool | None = None
    status: str = ""  # "CODE: details" for NOT_FOUND and ERROR
    # This stream once said the target exists: a later ABSENT is a deletion.
    existed: bool = False
    section: str = "add"  # how differences name an endpoint: add[...] or endpoint[...]
    common: Mapping[str, str] = dataclasses.field(default_factory=dict)  # set.* / cla.* paths
    # profile.* paths; None: not compared (xDS, or the side refuses GetProfile).
    profile: Mapping[str, str] | None = None
    profile_pending: bool = False
    # policy.* (Linkerd) or rds.* (xDS) paths: the target's routes; None: not compared
    # (no --routes, or the side refuses them).
    routes: Mapping[str, str] | None = None
    routes_pending: bool = False
    # This stream's messages by kind, and "redundant": those that changed nothing.
    messages: Mapping[str, int] = dataclasses.field(default_factory=dict)

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
    field: str = ""  # the full field path, e.g. add[10.0.0.1:80].metric_labels.pod
    ours: str = ""
    theirs: str = ""

    def text(self) -> str:
        if self.kind == "field":
            return f"{self.field}: ours {self.ours} != theirs {self.theirs}"
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


def field_differences(ours: Mapping[str, str], theirs: Mapping[str, str], ignore: FieldFilter,
                      prefix: str = "", endpoint: str = "") -> list[Difference]:
    """Each path either side sets whose values differ (an unset one is `(unset)`)."""
    out = []
    for path in sorted(ours.keys() | theirs.keys()):
        o, t = ours.get(path, UNSET), theirs.get(path, UNSET)
        full = f"{prefix}.{path}" if prefix else path
        if o != t and not ignore.ignores(full):
            out.append(Difference("field", endpoint, full, o, t))
    return out


def endpoint_differences(ours: Answer, theirs: Answer,
                         ignore: FieldFilter = NOTHING) -> list[Difference]:
    """Endpoints matched by address: those only one side has, and for the rest each
    field that differs."""
    out: list[Difference] = []
    section = ours.section
    for key in sorted(ours.endpoints.keys() | theirs.endpoints.keys()):
        o, t = ours.endpoints.get(key), theirs.endpoints.get(key)
        where = f"{section}[{key}]"
        if o is None or t is None:
            if not ignore.ignores(where):
                out.append(Difference("only-ours" if t is None else "only-theirs", key))
        else:
            out.extend(field_differences(o, t, ignore, where, key))
    return out


def message_differences(ours: Answer, theirs: Answer,
                        ignore: FieldFilter) -> list[Difference]:
    out = []
    for name in COMPARED_COUNTERS:
        o, t = ours.messages.get(name, 0), theirs.messages.get(name, 0)
        path = f"messages.{name}"
        if o != t and not ignore.ignores(path):
            out.append(Difference("field", "", path, str(o), str(t)))
    return out


def differences(ours: Answer, theirs: Answer,
                ignore: FieldFilter = NOTHING) -> list[Difference]:
    out = endpoint_differences(ours, theirs, ignore)
    out += field_differences(ours.common, theirs.common, ignore)
    if ours.profile is not None and theirs.profile is not None:
        out += field_differences(ours.profile, theirs.profile, ignore)
    if ours.routes is not None and theirs.routes is not None:
        out += field_differences(ours.routes, theirs.routes, ignore)
    out += message_differences(ours, theirs, ignore)
    return out


# Profile fields the two semantics fill differently, and how: Linkerd 2.20 leaves the
# ServiceProfile reference's kind empty (docs/linkerd.md, differences from Linkerd 2.20,
# row 8), proto semantics names it.
_SEMANTIC_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "profile.profile_ref.resource.kind": frozenset({"ServiceProfile", UNSET}),
}


def _is_semantic(d: Difference) -> bool:
    values = _SEMANTIC_FIELDS.get(d.field)
    return d.kind == "field" and values is not None and {d.ours, d.theirs} == values


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


def compare(ours: Answer, theirs: Answer, ignore: FieldFilter = NOTHING) -> Verdict:
    errors = [(side, ans) for side, ans in (("ours", ours), ("theirs", theirs))
              if ans.signal == ERROR]
    if errors:
        if (len(errors) == 2 and ours.code == theirs.code and ours.code in REJECTIONS):
            return Verdict(EQUAL)  # both reject the authority alike
        return Verdict(ERROR, (Difference("error", ours=ours.describe(),
                                          theirs=theirs.describe()),))
    if PENDING in (ours.signal, theirs.signal) or any(
            a.profile_pending or a.routes_pending for a in (ours, theirs)):
        return Verdict(PENDING)
    if not _compatible(ours, theirs):
        side = "ours" if ours.existence is False else "theirs"
        return Verdict(MISSING, (Difference("missing", ours=ours.describe(),
                                            theirs=theirs.describe()),), side)
    diffs = differences(ours, theirs, ignore)
    semantic = [d for d in diffs if _is_semantic(d)]
    if len(semantic) < len(diffs):
        return Verdict(DIFFERS, tuple(diffs))
    if ours.signal != theirs.signal and _semantics_pair(ours, theirs):
        return Verdict(SEMANTICS, (Difference("semantics", ours=ours.signal,
                                              theirs=theirs.signal), *semantic))
    if semantic:
        return Verdict(SEMANTICS, tuple(semantic))
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
    # Each side's message counts on its current stream (Linkerd: by kind, and redundant).
    messages: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)

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
        if any(self.messages.values()):
            out["messages"] = {side: dict(c) for side, c in self.messages.items()}
        return out


@dataclass(slots=True)
class Record:
    target: str
    ours: Answer = dataclasses.field(default_factory=Answer)
    theirs: Answer = dataclasses.field(default_factory=Answer)
    verdict: Verdict = dataclasses.field(default_factory=lambda: Verdict(PENDING))
    shown: str = PENDING
    # Monotonic time agreement was lost (or first compared without agreeing).
    since: float | None = None
    changed_at: float = 0.0
    agreed_after: list[float] = dataclasses.field(default_factory=list)  # every time-to-agree


class Tracker:
    """One record per target; feeds answers in, gets events out.

    A disagreement shows as CONVERGING until `grace` seconds have passed since the
    last change on either side (the other side may simply not have caught up yet),
    then as its verdict. Errors show at once. When the sides agree again, the time
    since agreement was lost is reported.
    """

    def __init__(self, grace: float, ignore: FieldFilter = NOTHING) -> None:
        self.grace = grace
        self.user = ignore  # --fields
        self.ignore = ignore  # --fields and what a side cannot say (`set_ignored`)
        self.records: dict[str, Record] = {}

    def add(self, target: str) -> bool:
        if target in self.records:
            return False
        self.records[target] = Record(target)
        return True

    def set_ignored(self, patterns: Iterable[str], now: float) -> list[Event]:
        """Ignore these too (a side that does not carry a field), re-evaluating all."""
        ignore = self.user.with_patterns(patterns)
        if ignore.patterns == self.ignore.patterns:
            return []
        self.ignore = ignore
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
        v = compare(rec.ours, rec.theirs, self.ignore)
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
                      rec.ours.describe(), rec.theirs.describe(), time.time(),
                      {"ours": rec.ours.messages, "theirs": rec.theirs.messages})]

    def unagreed(self) -> list[Record]:
        return [r for r in self.records.values() if not r.verdict.agrees]
