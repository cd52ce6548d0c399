"""`meshbridge profile AUTHORITY`: follow a destination GetProfile stream.

AUTHORITY is a service (`web.emojivoto.svc.cluster.local:80`), a cluster IP or pod
IP with a port, or a StatefulSet pod's DNS name. Prints each DestinationProfile as
it arrives: routes, retry budget, traffic split and (for a workload) its endpoint;
`--json` for one JSON object per message.
"""

from __future__ import annotations

import argparse

from bridge.authority import parse_target
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.render import add_client_arguments, describe_profile, follow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)


def run(args: argparse.Namespace) -> int:
    args.authority = parse_target(args.authority)  # one grammar for every subcommand
    return follow(args, "GetProfile", dst.DestinationProfile, describe_profile)
