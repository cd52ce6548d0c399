"""Routes: the one routing truth every client kind is served from.

`objects` decodes the route kinds (Gateway API HTTPRoute and GRPCRoute, Linkerd's
HTTPRoute) into frozen values, each problem recorded with its field path
(`validate_route` gives them for one object, as an admission check would);
`resolve` turns the routes attached to one Service port into an immutable
`RouteTable`; `index` keeps those tables up to date as the cluster changes,
recomputing only the ports a change touches. The rules are written down in
docs/protocol/routes.md (cited here as `Routes §N`).
"""
