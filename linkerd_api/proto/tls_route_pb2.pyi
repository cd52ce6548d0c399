from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SniMatch(_message.Message):
    __slots__ = ("exact", "suffix")
    class Suffix(_message.Message):
        __slots__ = ("reverse_labels",)
        REVERSE_LABELS_FIELD_NUMBER: _ClassVar[int]
        reverse_labels: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, reverse_labels: _Optional[_Iterable[str]] = ...) -> None: ...
    EXACT_FIELD_NUMBER: _ClassVar[int]
    SUFFIX_FIELD_NUMBER: _ClassVar[int]
    exact: str
    suffix: SniMatch.Suffix
    def __init__(self, exact: _Optional[str] = ..., suffix: _Optional[_Union[SniMatch.Suffix, _Mapping]] = ...) -> None: ...
