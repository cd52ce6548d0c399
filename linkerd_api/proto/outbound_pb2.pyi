import datetime

from linkerd_api.proto import net_pb2 as _net_pb2
from linkerd_api.proto import destination_pb2 as _destination_pb2
from linkerd_api.proto import meta_pb2 as _meta_pb2
from linkerd_api.proto import grpc_route_pb2 as _grpc_route_pb2
from linkerd_api.proto import opaque_route_pb2 as _opaque_route_pb2
from linkerd_api.proto import tls_route_pb2 as _tls_route_pb2
from linkerd_api.proto import http_route_pb2 as _http_route_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TrafficSpec(_message.Message):
    __slots__ = ("source_workload", "addr", "authority")
    SOURCE_WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    AUTHORITY_FIELD_NUMBER: _ClassVar[int]
    source_workload: str
    addr: _net_pb2.TcpAddress
    authority: str
    def __init__(self, source_workload: _Optional[str] = ..., addr: _Optional[_Union[_net_pb2.TcpAddress, _Mapping]] = ..., authority: _Optional[str] = ...) -> None: ...

class OutboundPolicy(_message.Message):
    __slots__ = ("protocol", "metadata")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    protocol: ProxyProtocol
    metadata: _meta_pb2.Metadata
    def __init__(self, protocol: _Optional[_Union[ProxyProtocol, _Mapping]] = ..., metadata: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ...) -> None: ...

class ProxyProtocol(_message.Message):
    __slots__ = ("detect", "opaque", "http1", "http2", "grpc", "tls")
    class Detect(_message.Message):
        __slots__ = ("timeout", "opaque", "http1", "http2")
        TIMEOUT_FIELD_NUMBER: _ClassVar[int]
        OPAQUE_FIELD_NUMBER: _ClassVar[int]
        HTTP1_FIELD_NUMBER: _ClassVar[int]
        HTTP2_FIELD_NUMBER: _ClassVar[int]
        timeout: _duration_pb2.Duration
        opaque: ProxyProtocol.Opaque
        http1: ProxyProtocol.Http1
        http2: ProxyProtocol.Http2
        def __init__(self, timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., opaque: _Optional[_Union[ProxyProtocol.Opaque, _Mapping]] = ..., http1: _Optional[_Union[ProxyProtocol.Http1, _Mapping]] = ..., http2: _Optional[_Union[ProxyProtocol.Http2, _Mapping]] = ...) -> None: ...
    class Opaque(_message.Message):
        __slots__ = ("routes",)
        ROUTES_FIELD_NUMBER: _ClassVar[int]
        routes: _containers.RepeatedCompositeFieldContainer[OpaqueRoute]
        def __init__(self, routes: _Optional[_Iterable[_Union[OpaqueRoute, _Mapping]]] = ...) -> None: ...
    class Http1(_message.Message):
        __slots__ = ("routes", "failure_accrual")
        ROUTES_FIELD_NUMBER: _ClassVar[int]
        FAILURE_ACCRUAL_FIELD_NUMBER: _ClassVar[int]
        routes: _containers.RepeatedCompositeFieldContainer[HttpRoute]
        failure_accrual: FailureAccrual
        def __init__(self, routes: _Optional[_Iterable[_Union[HttpRoute, _Mapping]]] = ..., failure_accrual: _Optional[_Union[FailureAccrual, _Mapping]] = ...) -> None: ...
    class Http2(_message.Message):
        __slots__ = ("routes", "failure_accrual")
        ROUTES_FIELD_NUMBER: _ClassVar[int]
        FAILURE_ACCRUAL_FIELD_NUMBER: _ClassVar[int]
        routes: _containers.RepeatedCompositeFieldContainer[HttpRoute]
        failure_accrual: FailureAccrual
        def __init__(self, routes: _Optional[_Iterable[_Union[HttpRoute, _Mapping]]] = ..., failure_accrual: _Optional[_Union[FailureAccrual, _Mapping]] = ...) -> None: ...
    class Grpc(_message.Message):
        __slots__ = ("routes", "failure_accrual")
        ROUTES_FIELD_NUMBER: _ClassVar[int]
        FAILURE_ACCRUAL_FIELD_NUMBER: _ClassVar[int]
        routes: _containers.RepeatedCompositeFieldContainer[GrpcRoute]
        failure_accrual: FailureAccrual
        def __init__(self, routes: _Optional[_Iterable[_Union[GrpcRoute, _Mapping]]] = ..., failure_accrual: _Optional[_Union[FailureAccrual, _Mapping]] = ...) -> None: ...
    class Tls(_message.Message):
        __slots__ = ("routes",)
        ROUTES_FIELD_NUMBER: _ClassVar[int]
        routes: _containers.RepeatedCompositeFieldContainer[TlsRoute]
        def __init__(self, routes: _Optional[_Iterable[_Union[TlsRoute, _Mapping]]] = ...) -> None: ...
    DETECT_FIELD_NUMBER: _ClassVar[int]
    OPAQUE_FIELD_NUMBER: _ClassVar[int]
    HTTP1_FIELD_NUMBER: _ClassVar[int]
    HTTP2_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    detect: ProxyProtocol.Detect
    opaque: ProxyProtocol.Opaque
    http1: ProxyProtocol.Http1
    http2: ProxyProtocol.Http2
    grpc: ProxyProtocol.Grpc
    tls: ProxyProtocol.Tls
    def __init__(self, detect: _Optional[_Union[ProxyProtocol.Detect, _Mapping]] = ..., opaque: _Optional[_Union[ProxyProtocol.Opaque, _Mapping]] = ..., http1: _Optional[_Union[ProxyProtocol.Http1, _Mapping]] = ..., http2: _Optional[_Union[ProxyProtocol.Http2, _Mapping]] = ..., grpc: _Optional[_Union[ProxyProtocol.Grpc, _Mapping]] = ..., tls: _Optional[_Union[ProxyProtocol.Tls, _Mapping]] = ...) -> None: ...

class HttpRoute(_message.Message):
    __slots__ = ("metadata", "hosts", "rules")
    class Rule(_message.Message):
        __slots__ = ("matches", "filters", "backends", "requestTimeout", "timeouts", "retry", "allow_l5d_request_headers")
        MATCHES_FIELD_NUMBER: _ClassVar[int]
        FILTERS_FIELD_NUMBER: _ClassVar[int]
        BACKENDS_FIELD_NUMBER: _ClassVar[int]
        REQUESTTIMEOUT_FIELD_NUMBER: _ClassVar[int]
        TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
        RETRY_FIELD_NUMBER: _ClassVar[int]
        ALLOW_L5D_REQUEST_HEADERS_FIELD_NUMBER: _ClassVar[int]
        matches: _containers.RepeatedCompositeFieldContainer[_http_route_pb2.HttpRouteMatch]
        filters: _containers.RepeatedCompositeFieldContainer[HttpRoute.Filter]
        backends: HttpRoute.Distribution
        requestTimeout: _duration_pb2.Duration
        timeouts: _http_route_pb2.Timeouts
        retry: HttpRoute.Retry
        allow_l5d_request_headers: bool
        def __init__(self, matches: _Optional[_Iterable[_Union[_http_route_pb2.HttpRouteMatch, _Mapping]]] = ..., filters: _Optional[_Iterable[_Union[HttpRoute.Filter, _Mapping]]] = ..., backends: _Optional[_Union[HttpRoute.Distribution, _Mapping]] = ..., requestTimeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., timeouts: _Optional[_Union[_http_route_pb2.Timeouts, _Mapping]] = ..., retry: _Optional[_Union[HttpRoute.Retry, _Mapping]] = ..., allow_l5d_request_headers: _Optional[bool] = ...) -> None: ...
    class Filter(_message.Message):
        __slots__ = ("failure_injector", "request_header_modifier", "redirect", "response_header_modifier")
        FAILURE_INJECTOR_FIELD_NUMBER: _ClassVar[int]
        REQUEST_HEADER_MODIFIER_FIELD_NUMBER: _ClassVar[int]
        REDIRECT_FIELD_NUMBER: _ClassVar[int]
        RESPONSE_HEADER_MODIFIER_FIELD_NUMBER: _ClassVar[int]
        failure_injector: _http_route_pb2.HttpFailureInjector
        request_header_modifier: _http_route_pb2.RequestHeaderModifier
        redirect: _http_route_pb2.RequestRedirect
        response_header_modifier: _http_route_pb2.ResponseHeaderModifier
        def __init__(self, failure_injector: _Optional[_Union[_http_route_pb2.HttpFailureInjector, _Mapping]] = ..., request_header_modifier: _Optional[_Union[_http_route_pb2.RequestHeaderModifier, _Mapping]] = ..., redirect: _Optional[_Union[_http_route_pb2.RequestRedirect, _Mapping]] = ..., response_header_modifier: _Optional[_Union[_http_route_pb2.ResponseHeaderModifier, _Mapping]] = ...) -> None: ...
    class Distribution(_message.Message):
        __slots__ = ("empty", "first_available", "random_available")
        class Empty(_message.Message):
            __slots__ = ()
            def __init__(self) -> None: ...
        class FirstAvailable(_message.Message):
            __slots__ = ("backends",)
            BACKENDS_FIELD_NUMBER: _ClassVar[int]
            backends: _containers.RepeatedCompositeFieldContainer[HttpRoute.RouteBackend]
            def __init__(self, backends: _Optional[_Iterable[_Union[HttpRoute.RouteBackend, _Mapping]]] = ...) -> None: ...
        class RandomAvailable(_message.Message):
            __slots__ = ("backends",)
            BACKENDS_FIELD_NUMBER: _ClassVar[int]
            backends: _containers.RepeatedCompositeFieldContainer[HttpRoute.WeightedRouteBackend]
            def __init__(self, backends: _Optional[_Iterable[_Union[HttpRoute.WeightedRouteBackend, _Mapping]]] = ...) -> None: ...
        EMPTY_FIELD_NUMBER: _ClassVar[int]
        FIRST_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
        RANDOM_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
        empty: HttpRoute.Distribution.Empty
        first_available: HttpRoute.Distribution.FirstAvailable
        random_available: HttpRoute.Distribution.RandomAvailable
        def __init__(self, empty: _Optional[_Union[HttpRoute.Distribution.Empty, _Mapping]] = ..., first_available: _Optional[_Union[HttpRoute.Distribution.FirstAvailable, _Mapping]] = ..., random_available: _Optional[_Union[HttpRoute.Distribution.RandomAvailable, _Mapping]] = ...) -> None: ...
    class Retry(_message.Message):
        __slots__ = ("max_retries", "max_request_bytes", "conditions", "timeout", "backoff")
        class Conditions(_message.Message):
            __slots__ = ("status_ranges",)
            class StatusRange(_message.Message):
                __slots__ = ("start", "end")
                START_FIELD_NUMBER: _ClassVar[int]
                END_FIELD_NUMBER: _ClassVar[int]
                start: int
                end: int
                def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...
            STATUS_RANGES_FIELD_NUMBER: _ClassVar[int]
            status_ranges: _containers.RepeatedCompositeFieldContainer[HttpRoute.Retry.Conditions.StatusRange]
            def __init__(self, status_ranges: _Optional[_Iterable[_Union[HttpRoute.Retry.Conditions.StatusRange, _Mapping]]] = ...) -> None: ...
        MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
        MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
        CONDITIONS_FIELD_NUMBER: _ClassVar[int]
        TIMEOUT_FIELD_NUMBER: _ClassVar[int]
        BACKOFF_FIELD_NUMBER: _ClassVar[int]
        max_retries: int
        max_request_bytes: int
        conditions: HttpRoute.Retry.Conditions
        timeout: _duration_pb2.Duration
        backoff: ExponentialBackoff
        def __init__(self, max_retries: _Optional[int] = ..., max_request_bytes: _Optional[int] = ..., conditions: _Optional[_Union[HttpRoute.Retry.Conditions, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff: _Optional[_Union[ExponentialBackoff, _Mapping]] = ...) -> None: ...
    class RouteBackend(_message.Message):
        __slots__ = ("backend", "filters", "requestTimeout")
        BACKEND_FIELD_NUMBER: _ClassVar[int]
        FILTERS_FIELD_NUMBER: _ClassVar[int]
        REQUESTTIMEOUT_FIELD_NUMBER: _ClassVar[int]
        backend: Backend
        filters: _containers.RepeatedCompositeFieldContainer[HttpRoute.Filter]
        requestTimeout: _duration_pb2.Duration
        def __init__(self, backend: _Optional[_Union[Backend, _Mapping]] = ..., filters: _Optional[_Iterable[_Union[HttpRoute.Filter, _Mapping]]] = ..., requestTimeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
    class WeightedRouteBackend(_message.Message):
        __slots__ = ("backend", "weight")
        BACKEND_FIELD_NUMBER: _ClassVar[int]
        WEIGHT_FIELD_NUMBER: _ClassVar[int]
        backend: HttpRoute.RouteBackend
        weight: int
        def __init__(self, backend: _Optional[_Union[HttpRoute.RouteBackend, _Mapping]] = ..., weight: _Optional[int] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    metadata: _meta_pb2.Metadata
    hosts: _containers.RepeatedCompositeFieldContainer[_http_route_pb2.HostMatch]
    rules: _containers.RepeatedCompositeFieldContainer[HttpRoute.Rule]
    def __init__(self, metadata: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ..., hosts: _Optional[_Iterable[_Union[_http_route_pb2.HostMatch, _Mapping]]] = ..., rules: _Optional[_Iterable[_Union[HttpRoute.Rule, _Mapping]]] = ...) -> None: ...

class GrpcRoute(_message.Message):
    __slots__ = ("metadata", "hosts", "rules")
    class Rule(_message.Message):
        __slots__ = ("matches", "filters", "backends", "requestTimeout", "timeouts", "retry", "allow_l5d_request_headers")
        MATCHES_FIELD_NUMBER: _ClassVar[int]
        FILTERS_FIELD_NUMBER: _ClassVar[int]
        BACKENDS_FIELD_NUMBER: _ClassVar[int]
        REQUESTTIMEOUT_FIELD_NUMBER: _ClassVar[int]
        TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
        RETRY_FIELD_NUMBER: _ClassVar[int]
        ALLOW_L5D_REQUEST_HEADERS_FIELD_NUMBER: _ClassVar[int]
        matches: _containers.RepeatedCompositeFieldContainer[_grpc_route_pb2.GrpcRouteMatch]
        filters: _containers.RepeatedCompositeFieldContainer[GrpcRoute.Filter]
        backends: GrpcRoute.Distribution
        requestTimeout: _duration_pb2.Duration
        timeouts: _http_route_pb2.Timeouts
        retry: GrpcRoute.Retry
        allow_l5d_request_headers: bool
        def __init__(self, matches: _Optional[_Iterable[_Union[_grpc_route_pb2.GrpcRouteMatch, _Mapping]]] = ..., filters: _Optional[_Iterable[_Union[GrpcRoute.Filter, _Mapping]]] = ..., backends: _Optional[_Union[GrpcRoute.Distribution, _Mapping]] = ..., requestTimeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., timeouts: _Optional[_Union[_http_route_pb2.Timeouts, _Mapping]] = ..., retry: _Optional[_Union[GrpcRoute.Retry, _Mapping]] = ..., allow_l5d_request_headers: _Optional[bool] = ...) -> None: ...
    class Filter(_message.Message):
        __slots__ = ("failure_injector", "request_header_modifier")
        FAILURE_INJECTOR_FIELD_NUMBER: _ClassVar[int]
        REQUEST_HEADER_MODIFIER_FIELD_NUMBER: _ClassVar[int]
        failure_injector: _grpc_route_pb2.GrpcFailureInjector
        request_header_modifier: _http_route_pb2.RequestHeaderModifier
        def __init__(self, failure_injector: _Optional[_Union[_grpc_route_pb2.GrpcFailureInjector, _Mapping]] = ..., request_header_modifier: _Optional[_Union[_http_route_pb2.RequestHeaderModifier, _Mapping]] = ...) -> None: ...
    class Distribution(_message.Message):
        __slots__ = ("empty", "first_available", "random_available")
        class Empty(_message.Message):
            __slots__ = ()
            def __init__(self) -> None: ...
        class FirstAvailable(_message.Message):
            __slots__ = ("backends",)
            BACKENDS_FIELD_NUMBER: _ClassVar[int]
            backends: _containers.RepeatedCompositeFieldContainer[GrpcRoute.RouteBackend]
            def __init__(self, backends: _Optional[_Iterable[_Union[GrpcRoute.RouteBackend, _Mapping]]] = ...) -> None: ...
        class RandomAvailable(_message.Message):
            __slots__ = ("backends",)
            BACKENDS_FIELD_NUMBER: _ClassVar[int]
            backends: _containers.RepeatedCompositeFieldContainer[GrpcRoute.WeightedRouteBackend]
            def __init__(self, backends: _Optional[_Iterable[_Union[GrpcRoute.WeightedRouteBackend, _Mapping]]] = ...) -> None: ...
        EMPTY_FIELD_NUMBER: _ClassVar[int]
        FIRST_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
        RANDOM_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
        empty: GrpcRoute.Distribution.Empty
        first_available: GrpcRoute.Distribution.FirstAvailable
        random_available: GrpcRoute.Distribution.RandomAvailable
        def __init__(self, empty: _Optional[_Union[GrpcRoute.Distribution.Empty, _Mapping]] = ..., first_available: _Optional[_Union[GrpcRoute.Distribution.FirstAvailable, _Mapping]] = ..., random_available: _Optional[_Union[GrpcRoute.Distribution.RandomAvailable, _Mapping]] = ...) -> None: ...
    class Retry(_message.Message):
        __slots__ = ("max_retries", "max_request_bytes", "conditions", "timeout", "backoff")
        class Conditions(_message.Message):
            __slots__ = ("cancelled", "deadine_exceeded", "resource_exhausted", "internal", "unavailable")
            CANCELLED_FIELD_NUMBER: _ClassVar[int]
            DEADINE_EXCEEDED_FIELD_NUMBER: _ClassVar[int]
            RESOURCE_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
            INTERNAL_FIELD_NUMBER: _ClassVar[int]
            UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
            cancelled: bool
            deadine_exceeded: bool
            resource_exhausted: bool
            internal: bool
            unavailable: bool
            def __init__(self, cancelled: _Optional[bool] = ..., deadine_exceeded: _Optional[bool] = ..., resource_exhausted: _Optional[bool] = ..., internal: _Optional[bool] = ..., unavailable: _Optional[bool] = ...) -> None: ...
        MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
        MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
        CONDITIONS_FIELD_NUMBER: _ClassVar[int]
        TIMEOUT_FIELD_NUMBER: _ClassVar[int]
        BACKOFF_FIELD_NUMBER: _ClassVar[int]
        max_retries: int
        max_request_bytes: int
        conditions: GrpcRoute.Retry.Conditions
        timeout: _duration_pb2.Duration
        backoff: ExponentialBackoff
        def __init__(self, max_retries: _Optional[int] = ..., max_request_bytes: _Optional[int] = ..., conditions: _Optional[_Union[GrpcRoute.Retry.Conditions, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., backoff: _Optional[_Union[ExponentialBackoff, _Mapping]] = ...) -> None: ...
    class RouteBackend(_message.Message):
        __slots__ = ("backend", "filters", "requestTimeout")
        BACKEND_FIELD_NUMBER: _ClassVar[int]
        FILTERS_FIELD_NUMBER: _ClassVar[int]
        REQUESTTIMEOUT_FIELD_NUMBER: _ClassVar[int]
        backend: Backend
        filters: _containers.RepeatedCompositeFieldContainer[GrpcRoute.Filter]
        requestTimeout: _duration_pb2.Duration
        def __init__(self, backend: _Optional[_Union[Backend, _Mapping]] = ..., filters: _Optional[_Iterable[_Union[GrpcRoute.Filter, _Mapping]]] = ..., requestTimeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
    class WeightedRouteBackend(_message.Message):
        __slots__ = ("backend", "weight")
        BACKEND_FIELD_NUMBER: _ClassVar[int]
        WEIGHT_FIELD_NUMBER: _ClassVar[int]
        backend: GrpcRoute.RouteBackend
        weight: int
        def __init__(self, backend: _Optional[_Union[GrpcRoute.RouteBackend, _Mapping]] = ..., weight: _Optional[int] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    metadata: _meta_pb2.Metadata
    hosts: _containers.RepeatedCompositeFieldContainer[_http_route_pb2.HostMatch]
    rules: _containers.RepeatedCompositeFieldContainer[GrpcRoute.Rule]
    def __init__(self, metadata: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ..., hosts: _Optional[_Iterable[_Union[_http_route_pb2.HostMatch, _Mapping]]] = ..., rules: _Optional[_Iterable[_Union[GrpcRoute.Rule, _Mapping]]] = ...) -> None: ...

class OpaqueRoute(_message.Message):
    __slots__ = ("metadata", "rules")
    class Rule(_message.Message):
        __slots__ = ("backends", "filters")
        BACKENDS_FIELD_NUMBER: _ClassVar[int]
        FILTERS_FIELD_NUMBER: _ClassVar[int]
        backends: OpaqueRoute.Distribution
        filters: _containers.RepeatedCompositeFieldContainer[OpaqueRoute.Filter]
        def __init__(self, backends: _Optional[_Union[OpaqueRoute.Distribution, _Mapping]] = ..., filters: _Optional[_Iterable[_Union[OpaqueRoute.Filter, _Mapping]]] = ...) -> None: ...
    class Filter(_message.Message):
        __slots__ = ("invalid", "forbidden")
        INVALID_FIELD_NUMBER: _ClassVar[int]
        FORBIDDEN_FIELD_NUMBER: _ClassVar[int]
        invalid: _opaque_route_pb2.Invalid
        forbidden: _opaque_route_pb2.Forbidden
        def __init__(self, invalid: _Optional[_Union[_opaque_route_pb2.Invalid, _Mapping]] = ..., forbidden: _Optional[_Union[_opaque_route_pb2.Forbidden, _Mapping]] = ...) -> None: ...
    class Distribution(_message.Message):
        __slots__ = ("empty", "first_available", "random_available")
        class Empty(_message.Message):
            __slots__ = ()
            def __init__(self) -> None: ...
        class FirstAvailable(_message.Message):
            __slots__ = ("backends",)
            BACKENDS_FIELD_NUMBER: _ClassVar[int]
            backends: _containers.RepeatedCompositeFieldContainer[OpaqueRoute.RouteBackend]
            def __init__(self, backends: _Optional[_Iterable[_Union[OpaqueRoute.RouteBackend, _Mapping]]] = ...) -> None: ...
        class RandomAvailable(_message.Message):
            __slots__ = ("backends",)
            BACKENDS_FIELD_NUMBER: _ClassVar[int]
            backends: _containers.RepeatedCompositeFieldContainer[OpaqueRoute.WeightedRouteBackend]
            def __init__(self, backends: _Optional[_Iterable[_Union[OpaqueRoute.WeightedRouteBackend, _Mapping]]] = ...) -> None: ...
        EMPTY_FIELD_NUMBER: _ClassVar[int]
        FIRST_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
        RANDOM_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
        empty: OpaqueRoute.Distribution.Empty
        first_available: OpaqueRoute.Distribution.FirstAvailable
        random_available: OpaqueRoute.Distribution.RandomAvailable
        def __init__(self, empty: _Optional[_Union[OpaqueRoute.Distribution.Empty, _Mapping]] = ..., first_available: _Optional[_Union[OpaqueRoute.Distribution.FirstAvailable, _Mapping]] = ..., random_available: _Optional[_Union[OpaqueRoute.Distribution.RandomAvailable, _Mapping]] = ...) -> None: ...
    class RouteBackend(_message.Message):
        __slots__ = ("backend", "filters")
        BACKEND_FIELD_NUMBER: _ClassVar[int]
        FILTERS_FIELD_NUMBER: _ClassVar[int]
        backend: Backend
        filters: _containers.RepeatedCompositeFieldContainer[OpaqueRoute.Filter]
        def __init__(self, backend: _Optional[_Union[Backend, _Mapping]] = ..., filters: _Optional[_Iterable[_Union[OpaqueRoute.Filter, _Mapping]]] = ...) -> None: ...
    class WeightedRouteBackend(_message.Message):
        __slots__ = ("backend", "weight")
        BACKEND_FIELD_NUMBER: _ClassVar[int]
        WEIGHT_FIELD_NUMBER: _ClassVar[int]
        backend: OpaqueRoute.RouteBackend
        weight: int
        def __init__(self, backend: _Optional[_Union[OpaqueRoute.RouteBackend, _Mapping]] = ..., weight: _Optional[int] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    metadata: _meta_pb2.Metadata
    rules: _containers.RepeatedCompositeFieldContainer[OpaqueRoute.Rule]
    def __init__(self, metadata: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ..., rules: _Optional[_Iterable[_Union[OpaqueRoute.Rule, _Mapping]]] = ...) -> None: ...

class TlsRoute(_message.Message):
    __slots__ = ("metadata", "snis", "rules")
    class Rule(_message.Message):
        __slots__ = ("backends", "filters")
        BACKENDS_FIELD_NUMBER: _ClassVar[int]
        FILTERS_FIELD_NUMBER: _ClassVar[int]
        backends: TlsRoute.Distribution
        filters: _containers.RepeatedCompositeFieldContainer[TlsRoute.Filter]
        def __init__(self, backends: _Optional[_Union[TlsRoute.Distribution, _Mapping]] = ..., filters: _Optional[_Iterable[_Union[TlsRoute.Filter, _Mapping]]] = ...) -> None: ...
    class Filter(_message.Message):
        __slots__ = ("invalid", "forbidden")
        INVALID_FIELD_NUMBER: _ClassVar[int]
        FORBIDDEN_FIELD_NUMBER: _ClassVar[int]
        invalid: _opaque_route_pb2.Invalid
        forbidden: _opaque_route_pb2.Forbidden
        def __init__(self, invalid: _Optional[_Union[_opaque_route_pb2.Invalid, _Mapping]] = ..., forbidden: _Optional[_Union[_opaque_route_pb2.Forbidden, _Mapping]] = ...) -> None: ...
    class Distribution(_message.Message):
        __slots__ = ("empty", "first_available", "random_available")
        class Empty(_message.Message):
            __slots__ = ()
            def __init__(self) -> None: ...
        class FirstAvailable(_message.Message):
            __slots__ = ("backends",)
            BACKENDS_FIELD_NUMBER: _ClassVar[int]
            backends: _containers.RepeatedCompositeFieldContainer[TlsRoute.RouteBackend]
            def __init__(self, backends: _Optional[_Iterable[_Union[TlsRoute.RouteBackend, _Mapping]]] = ...) -> None: ...
        class RandomAvailable(_message.Message):
            __slots__ = ("backends",)
            BACKENDS_FIELD_NUMBER: _ClassVar[int]
            backends: _containers.RepeatedCompositeFieldContainer[TlsRoute.WeightedRouteBackend]
            def __init__(self, backends: _Optional[_Iterable[_Union[TlsRoute.WeightedRouteBackend, _Mapping]]] = ...) -> None: ...
        EMPTY_FIELD_NUMBER: _ClassVar[int]
        FIRST_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
        RANDOM_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
        empty: TlsRoute.Distribution.Empty
        first_available: TlsRoute.Distribution.FirstAvailable
        random_available: TlsRoute.Distribution.RandomAvailable
        def __init__(self, empty: _Optional[_Union[TlsRoute.Distribution.Empty, _Mapping]] = ..., first_available: _Optional[_Union[TlsRoute.Distribution.FirstAvailable, _Mapping]] = ..., random_available: _Optional[_Union[TlsRoute.Distribution.RandomAvailable, _Mapping]] = ...) -> None: ...
    class RouteBackend(_message.Message):
        __slots__ = ("backend", "filters")
        BACKEND_FIELD_NUMBER: _ClassVar[int]
        FILTERS_FIELD_NUMBER: _ClassVar[int]
        backend: Backend
        filters: _containers.RepeatedCompositeFieldContainer[TlsRoute.Filter]
        def __init__(self, backend: _Optional[_Union[Backend, _Mapping]] = ..., filters: _Optional[_Iterable[_Union[TlsRoute.Filter, _Mapping]]] = ...) -> None: ...
    class WeightedRouteBackend(_message.Message):
        __slots__ = ("backend", "weight")
        BACKEND_FIELD_NUMBER: _ClassVar[int]
        WEIGHT_FIELD_NUMBER: _ClassVar[int]
        backend: TlsRoute.RouteBackend
        weight: int
        def __init__(self, backend: _Optional[_Union[TlsRoute.RouteBackend, _Mapping]] = ..., weight: _Optional[int] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SNIS_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    metadata: _meta_pb2.Metadata
    snis: _containers.RepeatedCompositeFieldContainer[_tls_route_pb2.SniMatch]
    rules: _containers.RepeatedCompositeFieldContainer[TlsRoute.Rule]
    def __init__(self, metadata: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ..., snis: _Optional[_Iterable[_Union[_tls_route_pb2.SniMatch, _Mapping]]] = ..., rules: _Optional[_Iterable[_Union[TlsRoute.Rule, _Mapping]]] = ...) -> None: ...

class Backend(_message.Message):
    __slots__ = ("metadata", "forward", "balancer", "queue")
    class EndpointDiscovery(_message.Message):
        __slots__ = ("dst",)
        class DestinationGet(_message.Message):
            __slots__ = ("path",)
            PATH_FIELD_NUMBER: _ClassVar[int]
            path: str
            def __init__(self, path: _Optional[str] = ...) -> None: ...
        DST_FIELD_NUMBER: _ClassVar[int]
        dst: Backend.EndpointDiscovery.DestinationGet
        def __init__(self, dst: _Optional[_Union[Backend.EndpointDiscovery.DestinationGet, _Mapping]] = ...) -> None: ...
    class BalanceP2c(_message.Message):
        __slots__ = ("discovery", "peak_ewma", "penalty_peak_ewma")
        class PeakEwma(_message.Message):
            __slots__ = ("default_rtt", "decay")
            DEFAULT_RTT_FIELD_NUMBER: _ClassVar[int]
            DECAY_FIELD_NUMBER: _ClassVar[int]
            default_rtt: _duration_pb2.Duration
            decay: _duration_pb2.Duration
            def __init__(self, default_rtt: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., decay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
        class PenaltyPeakEwma(_message.Message):
            __slots__ = ("default_rtt", "decay", "penalty", "max_retry_after", "penalty_decay")
            DEFAULT_RTT_FIELD_NUMBER: _ClassVar[int]
            DECAY_FIELD_NUMBER: _ClassVar[int]
            PENALTY_FIELD_NUMBER: _ClassVar[int]
            MAX_RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
            PENALTY_DECAY_FIELD_NUMBER: _ClassVar[int]
            default_rtt: _duration_pb2.Duration
            decay: _duration_pb2.Duration
            penalty: _duration_pb2.Duration
            max_retry_after: _duration_pb2.Duration
            penalty_decay: _duration_pb2.Duration
            def __init__(self, default_rtt: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., decay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., penalty: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., penalty_decay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
        DISCOVERY_FIELD_NUMBER: _ClassVar[int]
        PEAK_EWMA_FIELD_NUMBER: _ClassVar[int]
        PENALTY_PEAK_EWMA_FIELD_NUMBER: _ClassVar[int]
        discovery: Backend.EndpointDiscovery
        peak_ewma: Backend.BalanceP2c.PeakEwma
        penalty_peak_ewma: Backend.BalanceP2c.PenaltyPeakEwma
        def __init__(self, discovery: _Optional[_Union[Backend.EndpointDiscovery, _Mapping]] = ..., peak_ewma: _Optional[_Union[Backend.BalanceP2c.PeakEwma, _Mapping]] = ..., penalty_peak_ewma: _Optional[_Union[Backend.BalanceP2c.PenaltyPeakEwma, _Mapping]] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    BALANCER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    metadata: _meta_pb2.Metadata
    forward: _destination_pb2.WeightedAddr
    balancer: Backend.BalanceP2c
    queue: Queue
    def __init__(self, metadata: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ..., forward: _Optional[_Union[_destination_pb2.WeightedAddr, _Mapping]] = ..., balancer: _Optional[_Union[Backend.BalanceP2c, _Mapping]] = ..., queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class Queue(_message.Message):
    __slots__ = ("capacity", "failfast_timeout")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    FAILFAST_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    failfast_timeout: _duration_pb2.Duration
    def __init__(self, capacity: _Optional[int] = ..., failfast_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class FailureAccrual(_message.Message):
    __slots__ = ("consecutive_failures", "unified", "ejection")
    class ConsecutiveFailures(_message.Message):
        __slots__ = ("max_failures", "backoff")
        MAX_FAILURES_FIELD_NUMBER: _ClassVar[int]
        BACKOFF_FIELD_NUMBER: _ClassVar[int]
        max_failures: int
        backoff: ExponentialBackoff
        def __init__(self, max_failures: _Optional[int] = ..., backoff: _Optional[_Union[ExponentialBackoff, _Mapping]] = ...) -> None: ...
    class Unified(_message.Message):
        __slots__ = ("success_rate_threshold", "decay", "min_requests", "max_consecutive_failures", "backoff")
        SUCCESS_RATE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
        DECAY_FIELD_NUMBER: _ClassVar[int]
        MIN_REQUESTS_FIELD_NUMBER: _ClassVar[int]
        MAX_CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
        BACKOFF_FIELD_NUMBER: _ClassVar[int]
        success_rate_threshold: float
        decay: _duration_pb2.Duration
        min_requests: int
        max_consecutive_failures: int
        backoff: ExponentialBackoff
        def __init__(self, success_rate_threshold: _Optional[float] = ..., decay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., min_requests: _Optional[int] = ..., max_consecutive_failures: _Optional[int] = ..., backoff: _Optional[_Union[ExponentialBackoff, _Mapping]] = ...) -> None: ...
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    UNIFIED_FIELD_NUMBER: _ClassVar[int]
    EJECTION_FIELD_NUMBER: _ClassVar[int]
    consecutive_failures: FailureAccrual.ConsecutiveFailures
    unified: FailureAccrual.Unified
    ejection: EjectionConfig
    def __init__(self, consecutive_failures: _Optional[_Union[FailureAccrual.ConsecutiveFailures, _Mapping]] = ..., unified: _Optional[_Union[FailureAccrual.Unified, _Mapping]] = ..., ejection: _Optional[_Union[EjectionConfig, _Mapping]] = ...) -> None: ...

class EjectionConfig(_message.Message):
    __slots__ = ("min_ready_endpoints",)
    MIN_READY_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    min_ready_endpoints: int
    def __init__(self, min_ready_endpoints: _Optional[int] = ...) -> None: ...

class ExponentialBackoff(_message.Message):
    __slots__ = ("min_backoff", "max_backoff", "jitter_ratio", "respect_retry_after_hint")
    MIN_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    JITTER_RATIO_FIELD_NUMBER: _ClassVar[int]
    RESPECT_RETRY_AFTER_HINT_FIELD_NUMBER: _ClassVar[int]
    min_backoff: _duration_pb2.Duration
    max_backoff: _duration_pb2.Duration
    jitter_ratio: float
    respect_retry_after_hint: bool
    def __init__(self, min_backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., jitter_ratio: _Optional[float] = ..., respect_retry_after_hint: _Optional[bool] = ...) -> None: ...
