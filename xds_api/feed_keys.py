"""What a worker's xDS mirror and the watcher's feeds agree on: how a resource a
subscription is due is keyed (docs/workers.md, "What crosses the channel").

A resource depends on its type and name and on a few things about the client, which
differ by type (its *shape*): nothing for CDS and LDS; the client's kind and
namespace for RDS (Routes §1.2); its node, variant and LEDS preference for EDS (a
View per node; §2.1, §7); its node for LEDS. A feed is one (type, name, shape), or
(type, `*`, shape) for a wildcard: every stream of a worker whose subscriptions have
that key shares it, and the watcher keeps one subscription of its own per feed.

Messages, worker -> watcher: `xds.sub(feed, type, name, shape)`,
`xds.unsub(feed)`, `xds.weight(feed, streams)`; watcher -> worker: `xds.res(feed,
name, resource | None, published_at)` (a resource and what it became; None: it does
not exist), `xds.all(feed, [(name, resource)])` (a wildcard's whole set),
`xds.members(feed, exists, full, [(member, resource | None)], published_at)` (LEDS).
The first message of a feed is its snapshot: until it comes the feed is pending.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from xds_api import resource_types as rt
from xds_api.subscription import Subscription

# The Subscription fields a type's resources depend on.
SHAPE_FIELDS: dict[str, tuple[str, ...]] = {
    rt.CLUSTER: (),
    rt.LISTENER: (),
    rt.ROUTE: ("client", "namespace"),
    rt.ENDPOINT: ("node_name", "delta", "leds"),
    rt.LB_ENDPOINT: ("node_name",),
}

Shape = tuple[Any, ...]
FeedKey = tuple[str, str, Shape]  # (type URL, name or `*`, shape)


def _shape_getter(fields: tuple[str, ...]) -> Callable[[Subscription], Shape]:
    if not fields:
        return lambda sub: ()
    if len(fields) == 1:
        (name,) = fields
        return lambda sub: (getattr(sub, name),)
    getter: Callable[[Subscription], Shape] = attrgetter(*fields)  # a tuple for 2+
    return getter


# One getter per type: a worker's write path reads a stream's shape per stream per
# change (mirror._MirrorType.resource), where a generator over the fields cost ~5%.
_SHAPES = {t: _shape_getter(fields) for t, fields in SHAPE_FIELDS.items()}


def shape_of(sub: Subscription) -> Shape:
    return _SHAPES[sub.type_url](sub)


def subscription_for(type_url: str, shape: Shape) -> Subscription:
    """A subscription with the shape given (the watcher's own, for one feed)."""
    fields = dict(zip(SHAPE_FIELDS[type_url], shape, strict=True))
    if type_url == rt.LB_ENDPOINT:
        fields["delta"] = True  # LEDS is delta xDS only (§7.1)
    return Subscription(type_url, **fields)
