from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IPAddress(_message.Message):
    __slots__ = ("ipv4", "ipv6")
    IPV4_FIELD_NUMBER: _ClassVar[int]
    IPV6_FIELD_NUMBER: _ClassVar[int]
    ipv4: int
    ipv6: IPv6
    def __init__(self, ipv4: _Optional[int] = ..., ipv6: _Optional[_Union[IPv6, _Mapping]] = ...) -> None: ...

class IPNetwork(_message.Message):
    __slots__ = ("ip", "prefix_len")
    IP_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LEN_FIELD_NUMBER: _ClassVar[int]
    ip: IPAddress
    prefix_len: int
    def __init__(self, ip: _Optional[_Union[IPAddress, _Mapping]] = ..., prefix_len: _Optional[int] = ...) -> None: ...

class IPv6(_message.Message):
    __slots__ = ("first", "last")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class TcpAddress(_message.Message):
    __slots__ = ("ip", "port")
    IP_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ip: IPAddress
    port: int
    def __init__(self, ip: _Optional[_Union[IPAddress, _Mapping]] = ..., port: _Optional[int] = ...) -> None: ...
