"""Each protocol's messages as the flat fields `meshbridge shadow` compares
(`harness.shadow.fields` has the path grammar).

    Linkerd  WeightedAddr        add[<ip:port>].<its fields but addr>
             WeightedAddrSet     set.<its fields but addrs>   (metric_labels)
             DestinationProfile  profile.<its fields>
    xDS      LbEndpoint          endpoint[<ip:port>].<its fields but the address>,
                                 plus its LocalityLbEndpoints' fields (locality, priority,
                                 locality_load_balancing_weight, ...)
             ClusterLoadAssignment  cla.<its fields but cluster_name and endpoints>

xDS values are read as Envoy reads them, so two servers that mean the same compare
equal: an unset `health_status` (UNKNOWN) is HEALTHY, an unset endpoint
`load_balancing_weight` is 1.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from harness.normalize import tcp_address
from harness.shadow.fields import (
    XDS_CLA_SKIP,
    XDS_LOCALITY_SKIP,
    Flat,
    flatten,
    xds_locality_rename,
)

_RENAME = xds_locality_rename()
_ADDRESS = ("endpoint.address.socket_address.address",
            "endpoint.address.socket_address.port_value")


def address_key(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def weighted_addr_key(wa: Any) -> str:
    return address_key(*tcp_address(wa.addr))


def tcp_key(addr: Any) -> str:
    return address_key(*tcp_address(addr))


def weighted_addr(wa: Any) -> Flat:
    return flatten(wa, skip=("addr",))


def addr_set(was: Any) -> Flat:
    return flatten(was, "set", skip=("addrs",))


def profile(p: Any) -> Flat:
    return flatten(p, "profile")


def _lb_key(lb: Any) -> str:
    sa = lb.endpoint.address.socket_address
    try:
        ip = str(ipaddress.ip_address(sa.address))
    except ValueError:
        ip = sa.address  # a hostname (STRICT_DNS-style): keep it as sent
    return address_key(ip, int(sa.port_value))


def cla_endpoints(cla: Any) -> dict[str, Flat]:
    out: dict[str, Flat] = {}
    for loc in cla.endpoints:
        group = flatten(loc, skip=XDS_LOCALITY_SKIP, rename=_RENAME)
        for lb in loc.lb_endpoints:
            fields = flatten(lb)
            for path in _ADDRESS:
                fields.pop(path, None)
            if fields.get("health_status", "UNKNOWN") == "UNKNOWN":
                fields["health_status"] = "HEALTHY"
            fields.setdefault("load_balancing_weight.value", "1")
            fields.update(group)
            out[_lb_key(lb)] = fields
    return out


def cla_common(cla: Any) -> Flat:
    return flatten(cla, "cla", skip=XDS_CLA_SKIP)
