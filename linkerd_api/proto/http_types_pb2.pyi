from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HttpMethod(_message.Message):
    __slots__ = ("registered", "unregistered")
    class Registered(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        GET: _ClassVar[HttpMethod.Registered]
        POST: _ClassVar[HttpMethod.Registered]
        PUT: _ClassVar[HttpMethod.Registered]
        DELETE: _ClassVar[HttpMethod.Registered]
        PATCH: _ClassVar[HttpMethod.Registered]
        OPTIONS: _ClassVar[HttpMethod.Registered]
        CONNECT: _ClassVar[HttpMethod.Registered]
        HEAD: _ClassVar[HttpMethod.Registered]
        TRACE: _ClassVar[HttpMethod.Registered]
    GET: HttpMethod.Registered
    POST: HttpMethod.Registered
    PUT: HttpMethod.Registered
    DELETE: HttpMethod.Registered
    PATCH: HttpMethod.Registered
    OPTIONS: HttpMethod.Registered
    CONNECT: HttpMethod.Registered
    HEAD: HttpMethod.Registered
    TRACE: HttpMethod.Registered
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    UNREGISTERED_FIELD_NUMBER: _ClassVar[int]
    registered: HttpMethod.Registered
    unregistered: str
    def __init__(self, registered: _Optional[_Union[HttpMethod.Registered, str]] = ..., unregistered: _Optional[str] = ...) -> None: ...

class Scheme(_message.Message):
    __slots__ = ("registered", "unregistered")
    class Registered(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        HTTP: _ClassVar[Scheme.Registered]
        HTTPS: _ClassVar[Scheme.Registered]
    HTTP: Scheme.Registered
    HTTPS: Scheme.Registered
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    UNREGISTERED_FIELD_NUMBER: _ClassVar[int]
    registered: Scheme.Registered
    unregistered: str
    def __init__(self, registered: _Optional[_Union[Scheme.Registered, str]] = ..., unregistered: _Optional[str] = ...) -> None: ...

class Headers(_message.Message):
    __slots__ = ("headers",)
    class Header(_message.Message):
        __slots__ = ("name", "value")
        NAME_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        name: str
        value: bytes
        def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    headers: _containers.RepeatedCompositeFieldContainer[Headers.Header]
    def __init__(self, headers: _Optional[_Iterable[_Union[Headers.Header, _Mapping]]] = ...) -> None: ...
