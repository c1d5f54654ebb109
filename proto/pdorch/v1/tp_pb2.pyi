from proto.pdorch.v1 import worker_pb2 as _worker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StorePages(_message.Message):
    __slots__ = ("keys", "page_ids", "request_pages")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_PAGES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    request_pages: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., page_ids: _Optional[_Iterable[int]] = ..., request_pages: _Optional[_Iterable[int]] = ...) -> None: ...

class PagesDone(_message.Message):
    __slots__ = ("page_ok",)
    PAGE_OK_FIELD_NUMBER: _ClassVar[int]
    page_ok: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, page_ok: _Optional[_Iterable[bool]] = ...) -> None: ...

class TransferPages(_message.Message):
    __slots__ = ("read", "local_page_ids", "peers", "peer_page_addrs")
    READ_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    PEER_PAGE_ADDRS_FIELD_NUMBER: _ClassVar[int]
    read: bool
    local_page_ids: _containers.RepeatedScalarFieldContainer[int]
    peers: _containers.RepeatedCompositeFieldContainer[_worker_pb2.PoolRank]
    peer_page_addrs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, read: _Optional[bool] = ..., local_page_ids: _Optional[_Iterable[int]] = ..., peers: _Optional[_Iterable[_Union[_worker_pb2.PoolRank, _Mapping]]] = ..., peer_page_addrs: _Optional[_Iterable[int]] = ...) -> None: ...

class TransferDone(_message.Message):
    __slots__ = ("nbytes",)
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    nbytes: int
    def __init__(self, nbytes: _Optional[int] = ...) -> None: ...
