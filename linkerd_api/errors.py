"""Why a destination request is refused. Raised by the request logic; mapped to a
gRPC status in exactly one place (`linkerd_api.service.STATUS_OF`)."""

from __future__ import annotations


class DestinationError(Exception):
    """A request we will not serve; the message is what the caller is told."""


class BadRequest(DestinationError):
    """The request names nothing we can serve (a bad authority, an IP for Get, an
    ExternalName service)."""


class UnknownService(DestinationError):
    """The named Service does not exist (Get, linkerd-2.20 semantics)."""


class NoSuchWorkload(DestinationError):
    """A StatefulSet instance name that matches no pod."""


class AmbiguousAddress(DestinationError):
    """More than one Service or pod claims the requested address."""


class NotRemoteDiscoverable(DestinationError):
    """A remote-discovery mirror that does not say which remote service it mirrors."""


class UnknownCluster(DestinationError):
    """A remote-discovery mirror names a cluster that is not linked."""
