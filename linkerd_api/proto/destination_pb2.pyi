import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from linkerd_api.proto import http_types_pb2 as _http_types_pb2
from linkerd_api.proto import meta_pb2 as _meta_pb2
from linkerd_api.proto import net_pb2 as _net_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetDestination(_message.Message):
    __slots__ = ("scheme", "path", "context_token")
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    scheme: str
    path: str
    context_token: str
    def __init__(self, scheme: _Optional[str] = ..., path: _Optional[str] = ..., context_token: _Optional[str] = ...) -> None: ...

class Update(_message.Message):
    __slots__ = ("add", "remove", "no_endpoints")
    ADD_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    NO_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    add: WeightedAddrSet
    remove: AddrSet
    no_endpoints: NoEndpoints
    def __init__(self, add: _Optional[_Union[WeightedAddrSet, _Mapping]] = ..., remove: _Optional[_Union[AddrSet, _Mapping]] = ..., no_endpoints: _Optional[_Union[NoEndpoints, _Mapping]] = ...) -> None: ...

class AddrSet(_message.Message):
    __slots__ = ("addrs",)
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    addrs: _containers.RepeatedCompositeFieldContainer[_net_pb2.TcpAddress]
    def __init__(self, addrs: _Optional[_Iterable[_Union[_net_pb2.TcpAddress, _Mapping]]] = ...) -> None: ...

class WeightedAddrSet(_message.Message):
    __slots__ = ("addrs", "metric_labels")
    class MetricLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    METRIC_LABELS_FIELD_NUMBER: _ClassVar[int]
    addrs: _containers.RepeatedCompositeFieldContainer[WeightedAddr]
    metric_labels: _containers.ScalarMap[str, str]
    def __init__(self, addrs: _Optional[_Iterable[_Union[WeightedAddr, _Mapping]]] = ..., metric_labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WeightedAddr(_message.Message):
    __slots__ = ("addr", "weight", "metric_labels", "tls_identity", "protocol_hint", "authority_override", "http2", "resource_ref")
    class MetricLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ADDR_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    METRIC_LABELS_FIELD_NUMBER: _ClassVar[int]
    TLS_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_HINT_FIELD_NUMBER: _ClassVar[int]
    AUTHORITY_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    HTTP2_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_REF_FIELD_NUMBER: _ClassVar[int]
    addr: _net_pb2.TcpAddress
    weight: int
    metric_labels: _containers.ScalarMap[str, str]
    tls_identity: TlsIdentity
    protocol_hint: ProtocolHint
    authority_override: AuthorityOverride
    http2: Http2ClientParams
    resource_ref: _meta_pb2.Metadata
    def __init__(self, addr: _Optional[_Union[_net_pb2.TcpAddress, _Mapping]] = ..., weight: _Optional[int] = ..., metric_labels: _Optional[_Mapping[str, str]] = ..., tls_identity: _Optional[_Union[TlsIdentity, _Mapping]] = ..., protocol_hint: _Optional[_Union[ProtocolHint, _Mapping]] = ..., authority_override: _Optional[_Union[AuthorityOverride, _Mapping]] = ..., http2: _Optional[_Union[Http2ClientParams, _Mapping]] = ..., resource_ref: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ...) -> None: ...

class TlsIdentity(_message.Message):
    __slots__ = ("dns_like_identity", "uri_like_identity", "server_name")
    class DnsLikeIdentity(_message.Message):
        __slots__ = ("name",)
        NAME_FIELD_NUMBER: _ClassVar[int]
        name: str
        def __init__(self, name: _Optional[str] = ...) -> None: ...
    class UriLikeIdentity(_message.Message):
        __slots__ = ("uri",)
        URI_FIELD_NUMBER: _ClassVar[int]
        uri: str
        def __init__(self, uri: _Optional[str] = ...) -> None: ...
    DNS_LIKE_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    URI_LIKE_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    SERVER_NAME_FIELD_NUMBER: _ClassVar[int]
    dns_like_identity: TlsIdentity.DnsLikeIdentity
    uri_like_identity: TlsIdentity.UriLikeIdentity
    server_name: TlsIdentity.DnsLikeIdentity
    def __init__(self, dns_like_identity: _Optional[_Union[TlsIdentity.DnsLikeIdentity, _Mapping]] = ..., uri_like_identity: _Optional[_Union[TlsIdentity.UriLikeIdentity, _Mapping]] = ..., server_name: _Optional[_Union[TlsIdentity.DnsLikeIdentity, _Mapping]] = ...) -> None: ...

class AuthorityOverride(_message.Message):
    __slots__ = ("authority_override",)
    AUTHORITY_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    authority_override: str
    def __init__(self, authority_override: _Optional[str] = ...) -> None: ...

class NoEndpoints(_message.Message):
    __slots__ = ("exists",)
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    def __init__(self, exists: _Optional[bool] = ...) -> None: ...

class ProtocolHint(_message.Message):
    __slots__ = ("h2", "opaque", "opaque_transport")
    class H2(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Opaque(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class OpaqueTransport(_message.Message):
        __slots__ = ("inbound_port",)
        INBOUND_PORT_FIELD_NUMBER: _ClassVar[int]
        inbound_port: int
        def __init__(self, inbound_port: _Optional[int] = ...) -> None: ...
    H2_FIELD_NUMBER: _ClassVar[int]
    OPAQUE_FIELD_NUMBER: _ClassVar[int]
    OPAQUE_TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    h2: ProtocolHint.H2
    opaque: ProtocolHint.Opaque
    opaque_transport: ProtocolHint.OpaqueTransport
    def __init__(self, h2: _Optional[_Union[ProtocolHint.H2, _Mapping]] = ..., opaque: _Optional[_Union[ProtocolHint.Opaque, _Mapping]] = ..., opaque_transport: _Optional[_Union[ProtocolHint.OpaqueTransport, _Mapping]] = ...) -> None: ...

class Http2ClientParams(_message.Message):
    __slots__ = ("flow_control", "keep_alive", "internals")
    class FlowControl(_message.Message):
        __slots__ = ("initial_connection_window_size", "initial_stream_window_size", "adaptive_flow_control")
        INITIAL_CONNECTION_WINDOW_SIZE_FIELD_NUMBER: _ClassVar[int]
        INITIAL_STREAM_WINDOW_SIZE_FIELD_NUMBER: _ClassVar[int]
        ADAPTIVE_FLOW_CONTROL_FIELD_NUMBER: _ClassVar[int]
        initial_connection_window_size: int
        initial_stream_window_size: int
        adaptive_flow_control: bool
        def __init__(self, initial_connection_window_size: _Optional[int] = ..., initial_stream_window_size: _Optional[int] = ..., adaptive_flow_control: _Optional[bool] = ...) -> None: ...
    class KeepAlive(_message.Message):
        __slots__ = ("interval", "timeout", "while_idle")
        INTERVAL_FIELD_NUMBER: _ClassVar[int]
        TIMEOUT_FIELD_NUMBER: _ClassVar[int]
        WHILE_IDLE_FIELD_NUMBER: _ClassVar[int]
        interval: _duration_pb2.Duration
        timeout: _duration_pb2.Duration
        while_idle: bool
        def __init__(self, interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., while_idle: _Optional[bool] = ...) -> None: ...
    class Internals(_message.Message):
        __slots__ = ("max_concurrent_reset_streams", "max_frame_size", "max_send_buf_size")
        MAX_CONCURRENT_RESET_STREAMS_FIELD_NUMBER: _ClassVar[int]
        MAX_FRAME_SIZE_FIELD_NUMBER: _ClassVar[int]
        MAX_SEND_BUF_SIZE_FIELD_NUMBER: _ClassVar[int]
        max_concurrent_reset_streams: int
        max_frame_size: int
        max_send_buf_size: int
        def __init__(self, max_concurrent_reset_streams: _Optional[int] = ..., max_frame_size: _Optional[int] = ..., max_send_buf_size: _Optional[int] = ...) -> None: ...
    FLOW_CONTROL_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_FIELD_NUMBER: _ClassVar[int]
    INTERNALS_FIELD_NUMBER: _ClassVar[int]
    flow_control: Http2ClientParams.FlowControl
    keep_alive: Http2ClientParams.KeepAlive
    internals: Http2ClientParams.Internals
    def __init__(self, flow_control: _Optional[_Union[Http2ClientParams.FlowControl, _Mapping]] = ..., keep_alive: _Optional[_Union[Http2ClientParams.KeepAlive, _Mapping]] = ..., internals: _Optional[_Union[Http2ClientParams.Internals, _Mapping]] = ...) -> None: ...

class DestinationProfile(_message.Message):
    __slots__ = ("routes", "retry_budget", "dst_overrides", "opaque_protocol", "fully_qualified_name", "endpoint", "parent_ref", "profile_ref")
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    RETRY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    DST_OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    OPAQUE_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    FULLY_QUALIFIED_NAME_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PARENT_REF_FIELD_NUMBER: _ClassVar[int]
    PROFILE_REF_FIELD_NUMBER: _ClassVar[int]
    routes: _containers.RepeatedCompositeFieldContainer[Route]
    retry_budget: RetryBudget
    dst_overrides: _containers.RepeatedCompositeFieldContainer[WeightedDst]
    opaque_protocol: bool
    fully_qualified_name: str
    endpoint: WeightedAddr
    parent_ref: _meta_pb2.Metadata
    profile_ref: _meta_pb2.Metadata
    def __init__(self, routes: _Optional[_Iterable[_Union[Route, _Mapping]]] = ..., retry_budget: _Optional[_Union[RetryBudget, _Mapping]] = ..., dst_overrides: _Optional[_Iterable[_Union[WeightedDst, _Mapping]]] = ..., opaque_protocol: _Optional[bool] = ..., fully_qualified_name: _Optional[str] = ..., endpoint: _Optional[_Union[WeightedAddr, _Mapping]] = ..., parent_ref: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ..., profile_ref: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ...) -> None: ...

class Route(_message.Message):
    __slots__ = ("condition", "response_classes", "metrics_labels", "is_retryable", "timeout")
    class MetricsLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_CLASSES_FIELD_NUMBER: _ClassVar[int]
    METRICS_LABELS_FIELD_NUMBER: _ClassVar[int]
    IS_RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    condition: RequestMatch
    response_classes: _containers.RepeatedCompositeFieldContainer[ResponseClass]
    metrics_labels: _containers.ScalarMap[str, str]
    is_retryable: bool
    timeout: _duration_pb2.Duration
    def __init__(self, condition: _Optional[_Union[RequestMatch, _Mapping]] = ..., response_classes: _Optional[_Iterable[_Union[ResponseClass, _Mapping]]] = ..., metrics_labels: _Optional[_Mapping[str, str]] = ..., is_retryable: _Optional[bool] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RetryBudget(_message.Message):
    __slots__ = ("retry_ratio", "min_retries_per_second", "ttl")
    RETRY_RATIO_FIELD_NUMBER: _ClassVar[int]
    MIN_RETRIES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    retry_ratio: float
    min_retries_per_second: int
    ttl: _duration_pb2.Duration
    def __init__(self, retry_ratio: _Optional[float] = ..., min_retries_per_second: _Optional[int] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ResponseClass(_message.Message):
    __slots__ = ("condition", "is_failure")
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    IS_FAILURE_FIELD_NUMBER: _ClassVar[int]
    condition: ResponseMatch
    is_failure: bool
    def __init__(self, condition: _Optional[_Union[ResponseMatch, _Mapping]] = ..., is_failure: _Optional[bool] = ...) -> None: ...

class RequestMatch(_message.Message):
    __slots__ = ("all", "any", "path", "method")
    class Seq(_message.Message):
        __slots__ = ("matches",)
        MATCHES_FIELD_NUMBER: _ClassVar[int]
        matches: _containers.RepeatedCompositeFieldContainer[RequestMatch]
        def __init__(self, matches: _Optional[_Iterable[_Union[RequestMatch, _Mapping]]] = ...) -> None: ...
    ALL_FIELD_NUMBER: _ClassVar[int]
    ANY_FIELD_NUMBER: _ClassVar[int]
    NOT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    all: RequestMatch.Seq
    any: RequestMatch.Seq
    path: PathMatch
    method: _http_types_pb2.HttpMethod
    def __init__(self, all: _Optional[_Union[RequestMatch.Seq, _Mapping]] = ..., any: _Optional[_Union[RequestMatch.Seq, _Mapping]] = ..., path: _Optional[_Union[PathMatch, _Mapping]] = ..., method: _Optional[_Union[_http_types_pb2.HttpMethod, _Mapping]] = ..., **kwargs) -> None: ...

class PathMatch(_message.Message):
    __slots__ = ("regex",)
    REGEX_FIELD_NUMBER: _ClassVar[int]
    regex: str
    def __init__(self, regex: _Optional[str] = ...) -> None: ...

class ResponseMatch(_message.Message):
    __slots__ = ("all", "any", "status")
    class Seq(_message.Message):
        __slots__ = ("matches",)
        MATCHES_FIELD_NUMBER: _ClassVar[int]
        matches: _containers.RepeatedCompositeFieldContainer[ResponseMatch]
        def __init__(self, matches: _Optional[_Iterable[_Union[ResponseMatch, _Mapping]]] = ...) -> None: ...
    ALL_FIELD_NUMBER: _ClassVar[int]
    ANY_FIELD_NUMBER: _ClassVar[int]
    NOT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    all: ResponseMatch.Seq
    any: ResponseMatch.Seq
    status: HttpStatusRange
    def __init__(self, all: _Optional[_Union[ResponseMatch.Seq, _Mapping]] = ..., any: _Optional[_Union[ResponseMatch.Seq, _Mapping]] = ..., status: _Optional[_Union[HttpStatusRange, _Mapping]] = ..., **kwargs) -> None: ...

class HttpStatusRange(_message.Message):
    __slots__ = ("min", "max")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    min: int
    max: int
    def __init__(self, min: _Optional[int] = ..., max: _Optional[int] = ...) -> None: ...

class WeightedDst(_message.Message):
    __slots__ = ("authority", "weight", "backend_ref")
    AUTHORITY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    BACKEND_REF_FIELD_NUMBER: _ClassVar[int]
    authority: str
    weight: int
    backend_ref: _meta_pb2.Metadata
    def __init__(self, authority: _Optional[str] = ..., weight: _Optional[int] = ..., backend_ref: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ...) -> None: ...
