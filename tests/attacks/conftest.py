"""Each test's grpc.aio calls are over before its event loop closes (testkit.grpc_calls)."""

from testkit.grpc_calls import grpc_calls_settled

__all__ = ["grpc_calls_settled"]
