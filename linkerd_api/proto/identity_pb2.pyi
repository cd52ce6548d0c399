import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CertifyRequest(_message.Message):
    __slots__ = ("identity", "token", "certificate_signing_request")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_SIGNING_REQUEST_FIELD_NUMBER: _ClassVar[int]
    identity: str
    token: bytes
    certificate_signing_request: bytes
    def __init__(self, identity: _Optional[str] = ..., token: _Optional[bytes] = ..., certificate_signing_request: _Optional[bytes] = ...) -> None: ...

class CertifyResponse(_message.Message):
    __slots__ = ("leaf_certificate", "intermediate_certificates", "valid_until")
    LEAF_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    INTERMEDIATE_CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    leaf_certificate: bytes
    intermediate_certificates: _containers.RepeatedScalarFieldContainer[bytes]
    valid_until: _timestamp_pb2.Timestamp
    def __init__(self, leaf_certificate: _Optional[bytes] = ..., intermediate_certificates: _Optional[_Iterable[bytes]] = ..., valid_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
