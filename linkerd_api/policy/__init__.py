"""Linkerd's policy APIs (io.linkerd.proxy.outbound.OutboundPolicies and
io.linkerd.proxy.inbound.InboundServerPolicies), served from the same Cluster cache
as the destination API. `outbound` and `inbound` translate; `service` is the layer.

A bare `§N` in this package is a section of docs/protocol/linkerd-destination.md.
"""
