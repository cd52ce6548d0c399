"""`meshbridge profile AUTHORITY`: follow a destination GetProfile stream.

AUTHORITY is a service (`web.emojivoto.svc.cluster.local:80`), a cluster IP or pod
IP with a port, or a StatefulSet pod's DNS name. Prints each DestinationProfile as
it arrives: routes, retry budget, traffic split and (for a workload) its endpoint;
`--json` for one JSON object per message.

GetProfile answers a name that matches no service with a default profile (a proxy
needs one either way), so for a name the client first asks Get whether the service
exists, and a name that matches nothing is an error (one line on stderr, exit 1).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

import grpc

from bridge.authority import parse_target
from linkerd_api.client import no_such_service
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.render import add_client_arguments, describe_profile, follow
from meshbridge.client_tls import sync_channel

# How long the existence check waits for Get's first answer. Linkerd 2.20's own
# semantics are silent for a service with no endpoints: silence means it exists.
EXISTS_CHECK_SECONDS = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)


def _is_ip(authority: str) -> bool:
    host = authority.rsplit(":", 1)[0].strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def missing_service(args: argparse.Namespace) -> str | None:
    """Why the name matches no service, per the server's Get answer; None if it
    exists, or if Get cannot tell (then GetProfile has the last word)."""
    deadline = min(EXISTS_CHECK_SECONDS, args.timeout or EXISTS_CHECK_SECONDS)
    request = dst.GetDestination(scheme="k8s", path=args.authority, context_token=args.token)
    with sync_channel(args) as channel:
        call = channel.unary_stream(
            "/io.linkerd.proxy.destination.Destination/Get",
            request_serializer=dst.GetDestination.SerializeToString,
            response_deserializer=dst.Update.FromString,
        )(request, timeout=deadline)
        try:
            for update in call:
                call.cancel()
                return no_such_service(args.authority, update)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return f"{args.authority} matches nothing (Get: NOT_FOUND: {e.details()})"
    return None


def run(args: argparse.Namespace) -> int:
    args.authority = parse_target(args.authority)  # one grammar for every subcommand
    if not _is_ip(args.authority):
        reason = missing_service(args)
        if reason:
            print(f"error: {reason}", file=sys.stderr)
            return 1
    return follow(args, "GetProfile", dst.DestinationProfile, describe_profile)
