"""`meshbridge get AUTHORITY`: follow a destination Get stream, as a proxy would.

Prints each Update as it arrives: readable by default, one line per endpoint with
its identity, protocol hint, zone and weight (in the spirit of
`linkerd diagnostics endpoints`); `--json` for one JSON object per message.

A name that matches no service is an error (one line on stderr, exit 1), whether
the server says so with NOT_FOUND or with a first `no_endpoints{exists: false}`; a
service that exists with no endpoints is a valid answer (`no_endpoints exists=true`,
exit 0).
"""

from __future__ import annotations

import argparse
from typing import Any

from bridge.authority import parse_target
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.render import add_client_arguments, describe_update, follow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)


def no_such_service(authority: str, update: Any) -> str | None:
    """Why this first Update means the name matches nothing, or None."""
    if isinstance(update, dst.Update) and update.WhichOneof("update") == "no_endpoints" \
            and not update.no_endpoints.exists:
        return f"no service {authority} (the server answered no_endpoints exists=false)"
    return None


def run(args: argparse.Namespace) -> int:
    args.authority = parse_target(args.authority)  # one grammar for every subcommand
    authority = args.authority
    return follow(args, "Get", dst.Update, describe_update,
                  refuse_first=lambda update: no_such_service(authority, update))
