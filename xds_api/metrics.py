"""The xDS layer's metrics, registered on the App's registry.

Names follow Istio's pilot metrics where the meaning is the same (/metrics writes
those counters without the `_total` prometheus-client adds: meshbridge/exposition.py);
the rest are meshbridge's own, `meshbridge_*`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from meshbridge.loopmetrics import LoopCounter
from xds_api import resource_types as rt

_TYPES = (*rt.ORDER, "other")


class XdsMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.registry = reg
        streams = Gauge("pilot_xds", "Connected xDS streams.", ["api"], registry=reg)
        # Counted once per response per stream, on the loop thread: lock-free.
        pushes = LoopCounter("pilot_xds_pushes", "xDS responses sent.", ["type"], registry=reg)
        push_bytes = LoopCounter("meshbridge_xds_push_bytes", "Bytes of xDS responses sent.",
                                 ["type"], registry=reg)
        rejects = Counter("pilot_total_xds_rejects",
                          "xDS responses rejected by clients (NACKs).", ["type"],
                          registry=reg)
        stale = Counter("pilot_xds_expired_nonce",
                        "SotW requests ignored because their nonce is stale.", ["type"],
                        registry=reg)
        reconnects = Counter(
            "meshbridge_xds_reconnects_current",
            "SotW streams whose first request presented the version of exactly what "
            "they were then sent (a client back from another replica, up to date).",
            ["type"], registry=reg)
        self.write_timeouts = Counter(
            "pilot_xds_write_timeout",
            "Streams cut off because the client stopped reading.", registry=reg)
        self.bad_requests = Counter(
            "meshbridge_xds_bad_requests",
            "Requests refused or ignored as malformed, by reason.", ["reason"], registry=reg)
        serializations = Counter(
            "meshbridge_xds_serializations",
            "Resources encoded; each is shared by every stream that sends it.", ["type"],
            registry=reg)
        # Children bound once: a push to 5,000 streams must not look labels up 5,000 times.
        self.streams = {api: streams.labels(api) for api in ("sotw", "delta")}
        self.pushes = {t: pushes.labels(rt.short_name(t)) for t in _TYPES}
        self.push_bytes = {t: push_bytes.labels(rt.short_name(t)) for t in _TYPES}
        self.rejects = {t: rejects.labels(rt.short_name(t)) for t in _TYPES}
        self.stale = {t: stale.labels(rt.short_name(t)) for t in _TYPES}
        self.serializations = {t: serializations.labels(rt.short_name(t)) for t in _TYPES}
        self.reconnects_current = {t: reconnects.labels(rt.short_name(t)) for t in _TYPES}

    @staticmethod
    def key(type_url: str) -> str:
        return type_url if type_url in rt.SHORT else "other"
