import datetime

from linkerd_api.proto import http_types_pb2 as _http_types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HostMatch(_message.Message):
    __slots__ = ("exact", "suffix")
    class Suffix(_message.Message):
        __slots__ = ("reverse_labels",)
        REVERSE_LABELS_FIELD_NUMBER: _ClassVar[int]
        reverse_labels: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, reverse_labels: _Optional[_Iterable[str]] = ...) -> None: ...
    EXACT_FIELD_NUMBER: _ClassVar[int]
    SUFFIX_FIELD_NUMBER: _ClassVar[int]
    exact: str
    suffix: HostMatch.Suffix
    def __init__(self, exact: _Optional[str] = ..., suffix: _Optional[_Union[HostMatch.Suffix, _Mapping]] = ...) -> None: ...

class HttpRouteMatch(_message.Message):
    __slots__ = ("path", "headers", "query_params", "method")
    PATH_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    QUERY_PARAMS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    path: PathMatch
    headers: _containers.RepeatedCompositeFieldContainer[HeaderMatch]
    query_params: _containers.RepeatedCompositeFieldContainer[QueryParamMatch]
    method: _http_types_pb2.HttpMethod
    def __init__(self, path: _Optional[_Union[PathMatch, _Mapping]] = ..., headers: _Optional[_Iterable[_Union[HeaderMatch, _Mapping]]] = ..., query_params: _Optional[_Iterable[_Union[QueryParamMatch, _Mapping]]] = ..., method: _Optional[_Union[_http_types_pb2.HttpMethod, _Mapping]] = ...) -> None: ...

class PathMatch(_message.Message):
    __slots__ = ("exact", "prefix", "regex")
    EXACT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    exact: str
    prefix: str
    regex: str
    def __init__(self, exact: _Optional[str] = ..., prefix: _Optional[str] = ..., regex: _Optional[str] = ...) -> None: ...

class HeaderMatch(_message.Message):
    __slots__ = ("name", "exact", "regex")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    name: str
    exact: bytes
    regex: str
    def __init__(self, name: _Optional[str] = ..., exact: _Optional[bytes] = ..., regex: _Optional[str] = ...) -> None: ...

class QueryParamMatch(_message.Message):
    __slots__ = ("name", "exact", "regex")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    name: str
    exact: str
    regex: str
    def __init__(self, name: _Optional[str] = ..., exact: _Optional[str] = ..., regex: _Optional[str] = ...) -> None: ...

class RequestHeaderModifier(_message.Message):
    __slots__ = ("add", "set", "remove")
    ADD_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    add: _http_types_pb2.Headers
    set: _http_types_pb2.Headers
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, add: _Optional[_Union[_http_types_pb2.Headers, _Mapping]] = ..., set: _Optional[_Union[_http_types_pb2.Headers, _Mapping]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class ResponseHeaderModifier(_message.Message):
    __slots__ = ("add", "set", "remove")
    ADD_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    add: _http_types_pb2.Headers
    set: _http_types_pb2.Headers
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, add: _Optional[_Union[_http_types_pb2.Headers, _Mapping]] = ..., set: _Optional[_Union[_http_types_pb2.Headers, _Mapping]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class RequestRedirect(_message.Message):
    __slots__ = ("scheme", "host", "path", "port", "status")
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    scheme: _http_types_pb2.Scheme
    host: str
    path: PathModifier
    port: int
    status: int
    def __init__(self, scheme: _Optional[_Union[_http_types_pb2.Scheme, _Mapping]] = ..., host: _Optional[str] = ..., path: _Optional[_Union[PathModifier, _Mapping]] = ..., port: _Optional[int] = ..., status: _Optional[int] = ...) -> None: ...

class PathModifier(_message.Message):
    __slots__ = ("full", "prefix")
    FULL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    full: str
    prefix: str
    def __init__(self, full: _Optional[str] = ..., prefix: _Optional[str] = ...) -> None: ...

class HttpFailureInjector(_message.Message):
    __slots__ = ("status", "message", "ratio")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    status: int
    message: str
    ratio: Ratio
    def __init__(self, status: _Optional[int] = ..., message: _Optional[str] = ..., ratio: _Optional[_Union[Ratio, _Mapping]] = ...) -> None: ...

class Ratio(_message.Message):
    __slots__ = ("numerator", "denominator")
    NUMERATOR_FIELD_NUMBER: _ClassVar[int]
    DENOMINATOR_FIELD_NUMBER: _ClassVar[int]
    numerator: int
    denominator: int
    def __init__(self, numerator: _Optional[int] = ..., denominator: _Optional[int] = ...) -> None: ...

class Timeouts(_message.Message):
    __slots__ = ("response", "request", "idle")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    response: _duration_pb2.Duration
    request: _duration_pb2.Duration
    idle: _duration_pb2.Duration
    def __init__(self, response: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., request: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., idle: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
