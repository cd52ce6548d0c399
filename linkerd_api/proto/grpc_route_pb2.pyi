from linkerd_api.proto import http_route_pb2 as _http_route_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GrpcRouteMatch(_message.Message):
    __slots__ = ("rpc", "headers")
    RPC_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    rpc: GrpcRpcMatch
    headers: _containers.RepeatedCompositeFieldContainer[_http_route_pb2.HeaderMatch]
    def __init__(self, rpc: _Optional[_Union[GrpcRpcMatch, _Mapping]] = ..., headers: _Optional[_Iterable[_Union[_http_route_pb2.HeaderMatch, _Mapping]]] = ...) -> None: ...

class GrpcRpcMatch(_message.Message):
    __slots__ = ("service", "method")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    service: str
    method: str
    def __init__(self, service: _Optional[str] = ..., method: _Optional[str] = ...) -> None: ...

class GrpcFailureInjector(_message.Message):
    __slots__ = ("code", "message", "ratio")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    ratio: _http_route_pb2.Ratio
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., ratio: _Optional[_Union[_http_route_pb2.Ratio, _Mapping]] = ...) -> None: ...
