import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from linkerd_api.proto import grpc_route_pb2 as _grpc_route_pb2
from linkerd_api.proto import http_route_pb2 as _http_route_pb2
from linkerd_api.proto import meta_pb2 as _meta_pb2
from linkerd_api.proto import net_pb2 as _net_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PortSpec(_message.Message):
    __slots__ = ("workload", "port")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    workload: str
    port: int
    def __init__(self, workload: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class Server(_message.Message):
    __slots__ = ("protocol", "server_ips", "authorizations", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SERVER_IPS_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATIONS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    protocol: ProxyProtocol
    server_ips: _containers.RepeatedCompositeFieldContainer[_net_pb2.IPAddress]
    authorizations: _containers.RepeatedCompositeFieldContainer[Authz]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, protocol: _Optional[_Union[ProxyProtocol, _Mapping]] = ..., server_ips: _Optional[_Iterable[_Union[_net_pb2.IPAddress, _Mapping]]] = ..., authorizations: _Optional[_Iterable[_Union[Authz, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ProxyProtocol(_message.Message):
    __slots__ = ("detect", "opaque", "tls", "http1", "http2", "grpc")
    class Detect(_message.Message):
        __slots__ = ("timeout", "http_routes", "http_local_rate_limit")
        TIMEOUT_FIELD_NUMBER: _ClassVar[int]
        HTTP_ROUTES_FIELD_NUMBER: _ClassVar[int]
        HTTP_LOCAL_RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
        timeout: _duration_pb2.Duration
        http_routes: _containers.RepeatedCompositeFieldContainer[HttpRoute]
        http_local_rate_limit: HttpLocalRateLimit
        def __init__(self, timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., http_routes: _Optional[_Iterable[_Union[HttpRoute, _Mapping]]] = ..., http_local_rate_limit: _Optional[_Union[HttpLocalRateLimit, _Mapping]] = ...) -> None: ...
    class Http1(_message.Message):
        __slots__ = ("routes", "local_rate_limit")
        ROUTES_FIELD_NUMBER: _ClassVar[int]
        LOCAL_RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
        routes: _containers.RepeatedCompositeFieldContainer[HttpRoute]
        local_rate_limit: HttpLocalRateLimit
        def __init__(self, routes: _Optional[_Iterable[_Union[HttpRoute, _Mapping]]] = ..., local_rate_limit: _Optional[_Union[HttpLocalRateLimit, _Mapping]] = ...) -> None: ...
    class Http2(_message.Message):
        __slots__ = ("routes", "local_rate_limit")
        ROUTES_FIELD_NUMBER: _ClassVar[int]
        LOCAL_RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
        routes: _containers.RepeatedCompositeFieldContainer[HttpRoute]
        local_rate_limit: HttpLocalRateLimit
        def __init__(self, routes: _Optional[_Iterable[_Union[HttpRoute, _Mapping]]] = ..., local_rate_limit: _Optional[_Union[HttpLocalRateLimit, _Mapping]] = ...) -> None: ...
    class Grpc(_message.Message):
        __slots__ = ("routes",)
        ROUTES_FIELD_NUMBER: _ClassVar[int]
        routes: _containers.RepeatedCompositeFieldContainer[GrpcRoute]
        def __init__(self, routes: _Optional[_Iterable[_Union[GrpcRoute, _Mapping]]] = ...) -> None: ...
    class Opaque(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Tls(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    DETECT_FIELD_NUMBER: _ClassVar[int]
    OPAQUE_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    HTTP1_FIELD_NUMBER: _ClassVar[int]
    HTTP2_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    detect: ProxyProtocol.Detect
    opaque: ProxyProtocol.Opaque
    tls: ProxyProtocol.Tls
    http1: ProxyProtocol.Http1
    http2: ProxyProtocol.Http2
    grpc: ProxyProtocol.Grpc
    def __init__(self, detect: _Optional[_Union[ProxyProtocol.Detect, _Mapping]] = ..., opaque: _Optional[_Union[ProxyProtocol.Opaque, _Mapping]] = ..., tls: _Optional[_Union[ProxyProtocol.Tls, _Mapping]] = ..., http1: _Optional[_Union[ProxyProtocol.Http1, _Mapping]] = ..., http2: _Optional[_Union[ProxyProtocol.Http2, _Mapping]] = ..., grpc: _Optional[_Union[ProxyProtocol.Grpc, _Mapping]] = ...) -> None: ...

class Authz(_message.Message):
    __slots__ = ("networks", "authentication", "labels", "metadata")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NETWORKS_FIELD_NUMBER: _ClassVar[int]
    AUTHENTICATION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    networks: _containers.RepeatedCompositeFieldContainer[Network]
    authentication: Authn
    labels: _containers.ScalarMap[str, str]
    metadata: _meta_pb2.Metadata
    def __init__(self, networks: _Optional[_Iterable[_Union[Network, _Mapping]]] = ..., authentication: _Optional[_Union[Authn, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., metadata: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ...) -> None: ...

class Network(_message.Message):
    __slots__ = ("net",)
    NET_FIELD_NUMBER: _ClassVar[int]
    EXCEPT_FIELD_NUMBER: _ClassVar[int]
    net: _net_pb2.IPNetwork
    def __init__(self, net: _Optional[_Union[_net_pb2.IPNetwork, _Mapping]] = ..., **kwargs) -> None: ...

class Authn(_message.Message):
    __slots__ = ("unauthenticated", "meshTLS")
    class PermitUnauthenticated(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class PermitMeshTLS(_message.Message):
        __slots__ = ("unauthenticated", "identities")
        class PermitClientIdentities(_message.Message):
            __slots__ = ("identities", "suffixes")
            IDENTITIES_FIELD_NUMBER: _ClassVar[int]
            SUFFIXES_FIELD_NUMBER: _ClassVar[int]
            identities: _containers.RepeatedCompositeFieldContainer[Identity]
            suffixes: _containers.RepeatedCompositeFieldContainer[IdentitySuffix]
            def __init__(self, identities: _Optional[_Iterable[_Union[Identity, _Mapping]]] = ..., suffixes: _Optional[_Iterable[_Union[IdentitySuffix, _Mapping]]] = ...) -> None: ...
        UNAUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
        IDENTITIES_FIELD_NUMBER: _ClassVar[int]
        unauthenticated: Authn.PermitUnauthenticated
        identities: Authn.PermitMeshTLS.PermitClientIdentities
        def __init__(self, unauthenticated: _Optional[_Union[Authn.PermitUnauthenticated, _Mapping]] = ..., identities: _Optional[_Union[Authn.PermitMeshTLS.PermitClientIdentities, _Mapping]] = ...) -> None: ...
    UNAUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
    MESHTLS_FIELD_NUMBER: _ClassVar[int]
    unauthenticated: Authn.PermitUnauthenticated
    meshTLS: Authn.PermitMeshTLS
    def __init__(self, unauthenticated: _Optional[_Union[Authn.PermitUnauthenticated, _Mapping]] = ..., meshTLS: _Optional[_Union[Authn.PermitMeshTLS, _Mapping]] = ...) -> None: ...

class Identity(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class IdentitySuffix(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, parts: _Optional[_Iterable[str]] = ...) -> None: ...

class HttpRoute(_message.Message):
    __slots__ = ("metadata", "hosts", "authorizations", "rules")
    class Rule(_message.Message):
        __slots__ = ("matches", "filters")
        MATCHES_FIELD_NUMBER: _ClassVar[int]
        FILTERS_FIELD_NUMBER: _ClassVar[int]
        matches: _containers.RepeatedCompositeFieldContainer[_http_route_pb2.HttpRouteMatch]
        filters: _containers.RepeatedCompositeFieldContainer[HttpRoute.Filter]
        def __init__(self, matches: _Optional[_Iterable[_Union[_http_route_pb2.HttpRouteMatch, _Mapping]]] = ..., filters: _Optional[_Iterable[_Union[HttpRoute.Filter, _Mapping]]] = ...) -> None: ...
    class Filter(_message.Message):
        __slots__ = ("failure_injector", "request_header_modifier", "redirect")
        FAILURE_INJECTOR_FIELD_NUMBER: _ClassVar[int]
        REQUEST_HEADER_MODIFIER_FIELD_NUMBER: _ClassVar[int]
        REDIRECT_FIELD_NUMBER: _ClassVar[int]
        failure_injector: _http_route_pb2.HttpFailureInjector
        request_header_modifier: _http_route_pb2.RequestHeaderModifier
        redirect: _http_route_pb2.RequestRedirect
        def __init__(self, failure_injector: _Optional[_Union[_http_route_pb2.HttpFailureInjector, _Mapping]] = ..., request_header_modifier: _Optional[_Union[_http_route_pb2.RequestHeaderModifier, _Mapping]] = ..., redirect: _Optional[_Union[_http_route_pb2.RequestRedirect, _Mapping]] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATIONS_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    metadata: _meta_pb2.Metadata
    hosts: _containers.RepeatedCompositeFieldContainer[_http_route_pb2.HostMatch]
    authorizations: _containers.RepeatedCompositeFieldContainer[Authz]
    rules: _containers.RepeatedCompositeFieldContainer[HttpRoute.Rule]
    def __init__(self, metadata: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ..., hosts: _Optional[_Iterable[_Union[_http_route_pb2.HostMatch, _Mapping]]] = ..., authorizations: _Optional[_Iterable[_Union[Authz, _Mapping]]] = ..., rules: _Optional[_Iterable[_Union[HttpRoute.Rule, _Mapping]]] = ...) -> None: ...

class GrpcRoute(_message.Message):
    __slots__ = ("metadata", "hosts", "authorizations", "rules")
    class Rule(_message.Message):
        __slots__ = ("matches", "filters")
        MATCHES_FIELD_NUMBER: _ClassVar[int]
        FILTERS_FIELD_NUMBER: _ClassVar[int]
        matches: _containers.RepeatedCompositeFieldContainer[_grpc_route_pb2.GrpcRouteMatch]
        filters: _containers.RepeatedCompositeFieldContainer[GrpcRoute.Filter]
        def __init__(self, matches: _Optional[_Iterable[_Union[_grpc_route_pb2.GrpcRouteMatch, _Mapping]]] = ..., filters: _Optional[_Iterable[_Union[GrpcRoute.Filter, _Mapping]]] = ...) -> None: ...
    class Filter(_message.Message):
        __slots__ = ("failure_injector", "request_header_modifier")
        FAILURE_INJECTOR_FIELD_NUMBER: _ClassVar[int]
        REQUEST_HEADER_MODIFIER_FIELD_NUMBER: _ClassVar[int]
        failure_injector: _grpc_route_pb2.GrpcFailureInjector
        request_header_modifier: _http_route_pb2.RequestHeaderModifier
        def __init__(self, failure_injector: _Optional[_Union[_grpc_route_pb2.GrpcFailureInjector, _Mapping]] = ..., request_header_modifier: _Optional[_Union[_http_route_pb2.RequestHeaderModifier, _Mapping]] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATIONS_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    metadata: _meta_pb2.Metadata
    hosts: _containers.RepeatedCompositeFieldContainer[_http_route_pb2.HostMatch]
    authorizations: _containers.RepeatedCompositeFieldContainer[Authz]
    rules: _containers.RepeatedCompositeFieldContainer[GrpcRoute.Rule]
    def __init__(self, metadata: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ..., hosts: _Optional[_Iterable[_Union[_http_route_pb2.HostMatch, _Mapping]]] = ..., authorizations: _Optional[_Iterable[_Union[Authz, _Mapping]]] = ..., rules: _Optional[_Iterable[_Union[GrpcRoute.Rule, _Mapping]]] = ...) -> None: ...

class HttpLocalRateLimit(_message.Message):
    __slots__ = ("metadata", "total", "identity", "overrides")
    class Override(_message.Message):
        __slots__ = ("limit", "clients")
        class ClientIdentities(_message.Message):
            __slots__ = ("identities",)
            IDENTITIES_FIELD_NUMBER: _ClassVar[int]
            identities: _containers.RepeatedCompositeFieldContainer[Identity]
            def __init__(self, identities: _Optional[_Iterable[_Union[Identity, _Mapping]]] = ...) -> None: ...
        LIMIT_FIELD_NUMBER: _ClassVar[int]
        CLIENTS_FIELD_NUMBER: _ClassVar[int]
        limit: HttpLocalRateLimit.Limit
        clients: HttpLocalRateLimit.Override.ClientIdentities
        def __init__(self, limit: _Optional[_Union[HttpLocalRateLimit.Limit, _Mapping]] = ..., clients: _Optional[_Union[HttpLocalRateLimit.Override.ClientIdentities, _Mapping]] = ...) -> None: ...
    class Limit(_message.Message):
        __slots__ = ("requestsPerSecond",)
        REQUESTSPERSECOND_FIELD_NUMBER: _ClassVar[int]
        requestsPerSecond: int
        def __init__(self, requestsPerSecond: _Optional[int] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    metadata: _meta_pb2.Metadata
    total: HttpLocalRateLimit.Limit
    identity: HttpLocalRateLimit.Limit
    overrides: _containers.RepeatedCompositeFieldContainer[HttpLocalRateLimit.Override]
    def __init__(self, metadata: _Optional[_Union[_meta_pb2.Metadata, _Mapping]] = ..., total: _Optional[_Union[HttpLocalRateLimit.Limit, _Mapping]] = ..., identity: _Optional[_Union[HttpLocalRateLimit.Limit, _Mapping]] = ..., overrides: _Optional[_Iterable[_Union[HttpLocalRateLimit.Override, _Mapping]]] = ...) -> None: ...
