# mypy: ignore-errors
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServiceClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTERACTIVE: _ClassVar[ServiceClass]
    BATCH: _ClassVar[ServiceClass]

class DegradedMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAIL_OPEN: _ClassVar[DegradedMode]
    FAIL_CLOSED: _ClassVar[DegradedMode]
INTERACTIVE: ServiceClass
BATCH: ServiceClass
FAIL_OPEN: DegradedMode
FAIL_CLOSED: DegradedMode

class AcquireRequest(_message.Message):
    __slots__ = ("pool", "team", "service_class", "est_tokens", "holder", "request_id", "try_only", "epoch", "wait_s")
    POOL_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    EST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRY_ONLY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    pool: str
    team: str
    service_class: ServiceClass
    est_tokens: int
    holder: str
    request_id: str
    try_only: bool
    epoch: int
    wait_s: float
    def __init__(self, pool: _Optional[str] = ..., team: _Optional[str] = ..., service_class: _Optional[_Union[ServiceClass, str]] = ..., est_tokens: _Optional[int] = ..., holder: _Optional[str] = ..., request_id: _Optional[str] = ..., try_only: _Optional[bool] = ..., epoch: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("granted", "grant_id", "priority", "borrowing", "saturated", "degraded", "owner", "epoch")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    BORROWING_FIELD_NUMBER: _ClassVar[int]
    SATURATED_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    grant_id: str
    priority: int
    borrowing: bool
    saturated: bool
    degraded: bool
    owner: str
    epoch: int
    def __init__(self, granted: _Optional[bool] = ..., grant_id: _Optional[str] = ..., priority: _Optional[int] = ..., borrowing: _Optional[bool] = ..., saturated: _Optional[bool] = ..., degraded: _Optional[bool] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("grant_id", "consumed")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    consumed: float
    def __init__(self, grant_id: _Optional[str] = ..., consumed: _Optional[float] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ItemError(_message.Message):
    __slots__ = ("code", "message", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AcquireManyRequest(_message.Message):
    __slots__ = ("holder", "requests")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    holder: str
    requests: _containers.RepeatedCompositeFieldContainer[AcquireRequest]
    def __init__(self, holder: _Optional[str] = ..., requests: _Optional[_Iterable[_Union[AcquireRequest, _Mapping]]] = ...) -> None: ...

class AcquireOutcome(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: AcquireResponse
    error: ItemError
    def __init__(self, response: _Optional[_Union[AcquireResponse, _Mapping]] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ...) -> None: ...

class AcquireManyResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[AcquireOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[AcquireOutcome, _Mapping]]] = ...) -> None: ...

class AcquireReply(_message.Message):
    __slots__ = ("request_id", "outcome")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    outcome: AcquireOutcome
    def __init__(self, request_id: _Optional[str] = ..., outcome: _Optional[_Union[AcquireOutcome, _Mapping]] = ...) -> None: ...

class ReleaseManyRequest(_message.Message):
    __slots__ = ("holder", "releases")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    holder: str
    releases: _containers.RepeatedCompositeFieldContainer[ReleaseRequest]
    def __init__(self, holder: _Optional[str] = ..., releases: _Optional[_Iterable[_Union[ReleaseRequest, _Mapping]]] = ...) -> None: ...

class ReleaseOutcome(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: ItemError
    def __init__(self, error: _Optional[_Union[ItemError, _Mapping]] = ...) -> None: ...

class ReleaseManyResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[ReleaseOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[ReleaseOutcome, _Mapping]]] = ...) -> None: ...

class HeldGrant(_message.Message):
    __slots__ = ("grant_id", "team", "priority", "borrowing", "est_tokens")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    BORROWING_FIELD_NUMBER: _ClassVar[int]
    EST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    team: str
    priority: int
    borrowing: bool
    est_tokens: int
    def __init__(self, grant_id: _Optional[str] = ..., team: _Optional[str] = ..., priority: _Optional[int] = ..., borrowing: _Optional[bool] = ..., est_tokens: _Optional[int] = ...) -> None: ...

class AdoptRequest(_message.Message):
    __slots__ = ("pool", "epoch", "holder", "grants", "complete")
    POOL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    pool: str
    epoch: int
    holder: str
    grants: _containers.RepeatedCompositeFieldContainer[HeldGrant]
    complete: bool
    def __init__(self, pool: _Optional[str] = ..., epoch: _Optional[int] = ..., holder: _Optional[str] = ..., grants: _Optional[_Iterable[_Union[HeldGrant, _Mapping]]] = ..., complete: _Optional[bool] = ...) -> None: ...

class AdoptResponse(_message.Message):
    __slots__ = ("adopted", "phantoms_dropped", "owner", "epoch")
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    PHANTOMS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    adopted: int
    phantoms_dropped: int
    owner: str
    epoch: int
    def __init__(self, adopted: _Optional[int] = ..., phantoms_dropped: _Optional[int] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class TeamStat(_message.Message):
    __slots__ = ("team", "share", "reserved", "in_flight", "borrowing", "in_flight_tokens", "usage", "level_fairshare", "rank", "phantoms", "within", "held")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    BORROWING_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FAIRSHARE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PHANTOMS_FIELD_NUMBER: _ClassVar[int]
    WITHIN_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    team: str
    share: float
    reserved: int
    in_flight: int
    borrowing: int
    in_flight_tokens: int
    usage: float
    level_fairshare: float
    rank: int
    phantoms: int
    within: int
    held: int
    def __init__(self, team: _Optional[str] = ..., share: _Optional[float] = ..., reserved: _Optional[int] = ..., in_flight: _Optional[int] = ..., borrowing: _Optional[int] = ..., in_flight_tokens: _Optional[int] = ..., usage: _Optional[float] = ..., level_fairshare: _Optional[float] = ..., rank: _Optional[int] = ..., phantoms: _Optional[int] = ..., within: _Optional[int] = ..., held: _Optional[int] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("pool", "capacity", "owner", "epoch", "teams", "snapshot_age_s")
    POOL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TEAMS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    pool: str
    capacity: int
    owner: str
    epoch: int
    teams: _containers.RepeatedCompositeFieldContainer[TeamStat]
    snapshot_age_s: float
    def __init__(self, pool: _Optional[str] = ..., capacity: _Optional[int] = ..., owner: _Optional[str] = ..., epoch: _Optional[int] = ..., teams: _Optional[_Iterable[_Union[TeamStat, _Mapping]]] = ..., snapshot_age_s: _Optional[float] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pools: _Optional[_Iterable[str]] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("renewed", "unknown", "ttl_s")
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    renewed: _containers.RepeatedScalarFieldContainer[str]
    unknown: _containers.RepeatedScalarFieldContainer[str]
    ttl_s: float
    def __init__(self, renewed: _Optional[_Iterable[str]] = ..., unknown: _Optional[_Iterable[str]] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolInfo(_message.Message):
    __slots__ = ("pool", "capacity", "owner", "owner_address", "epoch", "degraded_mode", "lends_all")
    POOL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_MODE_FIELD_NUMBER: _ClassVar[int]
    LENDS_ALL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    capacity: int
    owner: str
    owner_address: str
    epoch: int
    degraded_mode: DegradedMode
    lends_all: bool
    def __init__(self, pool: _Optional[str] = ..., capacity: _Optional[int] = ..., owner: _Optional[str] = ..., owner_address: _Optional[str] = ..., epoch: _Optional[int] = ..., degraded_mode: _Optional[_Union[DegradedMode, str]] = ..., lends_all: _Optional[bool] = ...) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolInfo]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolInfo, _Mapping]]] = ...) -> None: ...

class SetCapacityRequest(_message.Message):
    __slots__ = ("pool", "capacity")
    POOL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    pool: str
    capacity: int
    def __init__(self, pool: _Optional[str] = ..., capacity: _Optional[int] = ...) -> None: ...

class SetCapacityResponse(_message.Message):
    __slots__ = ("previous",)
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    previous: int
    def __init__(self, previous: _Optional[int] = ...) -> None: ...

class SwitchoverRequest(_message.Message):
    __slots__ = ("pool", "node")
    POOL_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    pool: str
    node: str
    def __init__(self, pool: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class SwitchoverResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
