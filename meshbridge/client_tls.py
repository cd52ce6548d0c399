"""Client-side TLS flags shared by `meshbridge get`, `profile` and `xds`, matching the
server's `--tls-cert`/`--tls-key`/`--client-ca`."""

from __future__ import annotations

import argparse

import grpc


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (for a server started with --tls-cert)")
    group.add_argument("--ca-cert", default=None,
                       help="PEM CA bundle that signed the server's certificate")
    group.add_argument("--cert", default=None, help="PEM client certificate (mTLS)")
    group.add_argument("--key", default=None, help="PEM private key for --cert")
    group.add_argument("--server-name", default=None,
                       help="name to check the server certificate against (SNI)")


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def _credentials(args: argparse.Namespace) -> tuple[grpc.ChannelCredentials | None,
                                                     list[tuple[str, str]]]:
    if not (args.ca_cert or args.cert):
        return None, []
    if bool(args.cert) != bool(args.key):
        raise SystemExit("--cert and --key go together")
    creds = grpc.ssl_channel_credentials(_read(args.ca_cert), _read(args.key), _read(args.cert))
    options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
    return creds, options


def sync_channel(args: argparse.Namespace) -> grpc.Channel:
    creds, options = _credentials(args)
    if creds is None:
        return grpc.insecure_channel(args.server)
    return grpc.secure_channel(args.server, creds, options=options)


def aio_channel(args: argparse.Namespace) -> grpc.aio.Channel:
    creds, options = _credentials(args)
    if creds is None:
        return grpc.aio.insecure_channel(args.server)
    return grpc.aio.secure_channel(args.server, creds, options=options)
