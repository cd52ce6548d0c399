"""What the server promises each HTTP/2 attack: one budget per attack (THE table), and
the verdict on what an attacker got. The budgets' timings are derived from the native
server's defences as `harness.SERVER_FLAGS` sets them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testkit.attacks.harness import SERVER_FLAGS

PROTOCOL_ERROR, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x1, 0x9, 0xB
NO_ERROR = 0x0

HANDSHAKE_TIMEOUT = float(SERVER_FLAGS["--h2-handshake-timeout"])
KEEPALIVE_TIME = float(SERVER_FLAGS["--h2-keepalive-time"])
KEEPALIVE_TIMEOUT = float(SERVER_FLAGS["--h2-keepalive-timeout"])
MAX_CONNECTIONS = int(SERVER_FLAGS["--max-connections-per-client"])
MARGIN = 10.0  # seconds a timer may fire late on a loaded 2-core machine
# The most an attack may take (attackers stop as soon as they have their answer).
CAP = 60.0


@dataclass(frozen=True)
class Budget:
    """What the server promises an attacker (all that is set must hold)."""

    goaway: frozenset[int] = frozenset()  # a GOAWAY with one of these codes
    rst_each: int | None = None  # every bad request reset with this code ...
    usable: bool = False  # ... and a valid request after them answered
    closed_within: float | None = None  # every connection closed by the server by then
    closed_not_before: float = 0.0  # ... and not before
    beyond_refused: int | None = None  # connections past this many refused
    seconds: float = CAP  # the attacker's cap (zero-window-readers: how long it holds)
    args: tuple[str, ...] = ()
    gauges: bool = False  # (e): the HTTP/2 gauges return to their baseline
    repeat: int = 1  # runs in a row, RSS held to the first run's baseline each time
    note: str = ""


CALM = frozenset({ENHANCE_YOUR_CALM})
COMPRESSION = frozenset({COMPRESSION_ERROR})

# THE table: one budget per attack, next to what the attack does.
ATTACKS: dict[str, Budget] = {
    # SETTINGS_INITIAL_WINDOW_SIZE=0, 500 blocked Get streams, WINDOW_UPDATE(0, +1) flood
    "window-update-flood": Budget(goaway=CALM),
    # the same streams, SETTINGS flood toggling INITIAL_WINDOW_SIZE 0 <-> 1
    "settings-toggle": Budget(goaway=CALM),
    # HEADERS + RST_STREAM(CANCEL) pairs, reconnecting (CVE-2023-44487)
    "rapid-reset": Budget(goaway=CALM, gauges=True),
    # PING flood, never reading (CVE-2019-9512)
    "ping-flood": Budget(goaway=CALM),
    # SETTINGS flood, never reading (CVE-2019-9515)
    "settings-flood": Budget(goaway=CALM),
    # malformed requests each provoking a RST_STREAM, never reading (CVE-2019-9514)
    "reset-trigger-flood": Budget(goaway=CALM),
    # empty DATA frames without END_STREAM on one open stream (CVE-2019-9518)
    "empty-frames": Budget(goaway=CALM),
    # PRIORITY frames for ever new streams (CVE-2019-9513)
    "priority-flood": Budget(goaway=CALM),
    # HEADERS without END_HEADERS, then endless 16 KiB CONTINUATIONs of header fields
    "continuation-flood": Budget(goaway=COMPRESSION),
    # HEADERS without END_HEADERS, then endless empty CONTINUATIONs
    "empty-continuation": Budget(goaway=CALM),
    # unknown gRPC method and plain GETs, as fast as possible, reconnecting (the budget
    # is 11,000 a connection: the failed-request budget beyond 10,000 concurrent streams)
    "junk-requests": Budget(goaway=CALM, seconds=2 * CAP),
    # one 4 KiB dynamic-table entry referenced 300 times per block
    "hpack-bomb": Budget(goaway=frozenset({ENHANCE_YOUR_CALM, COMPRESSION_ERROR}),
                         note="the only budget allowing two codes"),
    # one ~80 KiB header block, then a valid request
    "oversized-headers": Budget(goaway=COMPRESSION),
    # one request with 1,900 empty header names
    "empty-names": Budget(goaway=CALM),
    # uppercase name, connection, transfer-encoding, pseudo after regular, unknown
    # pseudo: each reset, then a valid request on the same connection is answered
    "bad-headers": Budget(rst_each=PROTOCOL_ERROR, usable=True),
    # 50 connections that send nothing
    "slowloris": Budget(closed_within=HANDSHAKE_TIMEOUT + MARGIN,
                        args=("--connections", "50")),
    # preface and SETTINGS, the server's SETTINGS never acknowledged
    "no-settings-ack": Budget(closed_within=HANDSHAKE_TIMEOUT + MARGIN),
    # handshake and one open Get stream, then PINGs unanswered
    "silent-peer": Budget(closed_within=KEEPALIVE_TIME + KEEPALIVE_TIMEOUT + MARGIN,
                          closed_not_before=KEEPALIVE_TIME * 0.9),
    # many connections from one address, each handshaken, all held
    "connection-flood": Budget(beyond_refused=MAX_CONNECTIONS,
                               args=("--connections", str(MAX_CONNECTIONS + 60))),
    # 20 connections x 25 Get streams on the churned service, window 0, never granted
    "zero-window-readers": Budget(seconds=3.0,
                                  args=("--connections", "20", "--target",
                                        "web.emojivoto.svc.cluster.local:80"),
                                  note="nothing promised to the attacker; memory bounded"),
    # What once left memory behind, three times in a row each: RSS must come back
    # within 20 MiB of where the first run started, after every run.
    # 100 connections, each HEADERS without END_HEADERS then thousands of empty
    # CONTINUATIONs
    "continuation-reconnect": Budget(goaway=CALM, repeat=3, args=("--connections", "100")),
    # 100 connections, each sending header blocks of 1,900 empty names
    "empty-names-reconnect": Budget(goaway=CALM, repeat=3, args=("--connections", "100")),
    # 5,000 Get streams at window 0, then a connection WINDOW_UPDATE(+1) flood
    "window-update-5000-streams": Budget(goaway=CALM, repeat=3),
    # 5,000 Get streams at window 0, INITIAL_WINDOW_SIZE toggled 0 <-> 1, never reading
    "settings-toggle-5000-unread": Budget(goaway=CALM, repeat=3),
}


def _codes(codes: list[int]) -> str:
    return "[" + ", ".join(f"{c:#x}" for c in codes) + "]"


def verdict(budget: Budget, got: dict[str, Any]) -> list[str]:
    """How the attacker's result falls short of the budget (empty: as promised)."""
    if not got:
        return ["no attacker result"]
    problems = []
    goaways: list[int] = list(got.get("goaway_codes", []))
    extra: dict[str, Any] = got.get("extra", {})
    if budget.goaway:
        wanted = " or ".join(f"{c:#x}" for c in sorted(budget.goaway))
        if not set(goaways) & budget.goaway:
            problems.append(f"expected GOAWAY({wanted}); got GOAWAY codes {_codes(goaways)}, "
                            f"RST_STREAM {got.get('rst_codes')}, closed by server: "
                            f"{got.get('closed_by_server')}")
        elif set(goaways) - budget.goaway - {NO_ERROR}:
            problems.append(f"expected GOAWAY({wanted}) only; got {_codes(goaways)}")
    if budget.rst_each is not None:
        bad: dict[str, str] = extra.get("bad", {})
        want = f"rst:{budget.rst_each:#x}"
        wrong = {k: v for k, v in bad.items() if v != want}
        if not bad or wrong:
            problems.append(f"expected RST_STREAM({budget.rst_each:#x}) for each bad request; "
                            f"got {wrong or bad}")
    if budget.usable and not extra.get("usable"):
        problems.append(f"connection not usable after the bad requests: valid request got "
                        f"{extra.get('valid_request')}, closed by server: "
                        f"{got.get('closed_by_server')}, GOAWAY {_codes(goaways)}")
    if budget.closed_within is not None:
        n, closed = got.get("connections", 0), got.get("connections_closed_by_server", 0)
        last, first = got.get("closed_after_max_s"), got.get("closed_after_s")
        if n == 0 or closed < n:
            problems.append(f"expected the server to close every connection within "
                            f"{budget.closed_within:g}s; it closed {closed} of {n} "
                            f"(attack ran {got.get('seconds')}s)")
        elif last is not None and last > budget.closed_within:
            problems.append(f"expected closes within {budget.closed_within:g}s; last after "
                            f"{last}s")
        if first is not None and first < budget.closed_not_before:
            problems.append(f"closed after {first}s: before {budget.closed_not_before:g}s")
    if budget.beyond_refused is not None:
        opened = int(extra.get("opened", 0))
        refused = int(extra.get("refused", 0))
        beyond = opened - budget.beyond_refused
        # The good clients' connections count too: a few more may go.
        if refused < beyond or refused > beyond + 10:
            problems.append(f"expected the {max(0, beyond)} connections beyond "
                            f"{budget.beyond_refused} refused (GOAWAY ENHANCE_YOUR_CALM); of "
                            f"{opened} opened, {refused} were, {extra.get('held')} held")
    return problems
