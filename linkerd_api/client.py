"""`meshbridge get AUTHORITY`: follow a destination Get stream, as a proxy would.

Prints each Update as it arrives: readable by default, one line per endpoint with
its identity, protocol hint, zone and weight (in the spirit of
`linkerd diagnostics endpoints`); `--json` for one JSON object per message.
"""

from __future__ import annotations

import argparse

from bridge.authority import parse_target
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.render import add_client_arguments, describe_update, follow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)


def run(args: argparse.Namespace) -> int:
    args.authority = parse_target(args.authority)  # one grammar for every subcommand
    return follow(args, "Get", dst.Update, describe_update)
