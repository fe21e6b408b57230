"""DescribeConfigs, IncrementalAlterConfigs and AlterConfigs on topics; DescribeConfigs of
the node and of consumer groups.

A topic's settings (Kafka's names: `cleanup.policy`, `min.cleanable.dirty.ratio`,
`retention.ms`, ...) live in the metadata quorum; an alter is one `AlterTopicConfig`
command, so it is checked exactly as a config at create and applied atomically (a bad value
is refused with INVALID_CONFIG naming the setting). IncrementalAlterConfigs maps SET and
DELETE onto it, and APPEND and SUBTRACT on a list setting (`cleanup.policy`, Kafka's one
list among the topic settings raftlog has) onto a SET of the list this node's copy holds
(or its default) with the values added or removed, as Kafka does; AlterConfigs replaces the
whole config, so a key it leaves out goes back to its default. `validate_only` runs the
same check on this node's copy of the metadata and commits nothing. Only topics are
altered: node settings are the node's own (`raftlog serve --set`); DescribeConfigs answers
them for this node's BROKER resource, and a GROUP resource's settings, from
`node_configs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from raftlog import errors
from raftlog.metadata import AlterTopicConfig
from raftlog.metadata.checks import check_alter_topic_config
from raftlog.metadata.commands import TOPIC_CONFIG_KEYS
from raftlog.partition.cleaning import CompactionSettings
from raftlog.partition.policy import topic_log_config
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.errors import kafka_error, metadata_result_error
from raftlog.rpc.kafka.node_configs import (
    SOURCE_DEFAULT,
    ConfigEntry,
    broker_configs,
    group_configs,
)
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module
from raftlog.rpc.security import Permission

__all__ = [
    "ALTER_CONFIGS",
    "DESCRIBE_CONFIGS",
    "INCREMENTAL_ALTER_CONFIGS",
    "alter_configs",
    "describe_configs",
    "incremental_alter_configs",
    "topic_configs",
]

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
# Kafka's ConfigResource types.
_TOPIC_RESOURCE, _BROKER_RESOURCE, _BROKER_LOGGER_RESOURCE = 2, 4, 8
_CLIENT_METRICS_RESOURCE, _GROUP_RESOURCE = 16, 32
_SOURCE_TOPIC = 1
_SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3
_LIST_KEYS = frozenset({"cleanup.policy"})
_ALTER_TIMEOUT_S = 30.0

Outcome = tuple[ErrorCode, str | None]


def topic_configs(ctx: KafkaContext, config: Mapping[str, str]) -> list[tuple[str, str, int]]:
    """(key, value, source) of every topic setting raftlog has: the topic's own, or the
    node's default (what `topic_log_config` gives a topic that sets nothing)."""
    base = topic_log_config(ctx.node_config.log, {})
    compaction = CompactionSettings()
    defaults = {
        "retention.bytes": str(-1 if base.retention_bytes is None else base.retention_bytes),
        "retention.ms": str(-1 if base.retention_ms is None else base.retention_ms),
        "segment.bytes": str(base.segment_bytes_max),
        "segment.ms": str(base.segment_age_ms_max),
        "max.message.bytes": str(base.batch_bytes_max),
        "cleanup.policy": "delete",
        "min.cleanable.dirty.ratio": str(compaction.min_cleanable_dirty_ratio),
        "min.compaction.lag.ms": str(compaction.min_compaction_lag_ms),
        "max.compaction.lag.ms": str(compaction.max_compaction_lag_ms),
        "delete.retention.ms": str(compaction.delete_retention_ms),
        "compression.type": "producer",
    }
    assert set(defaults) == set(TOPIC_CONFIG_KEYS), sorted(TOPIC_CONFIG_KEYS)
    return [
        (key, config[key], _SOURCE_TOPIC) if key in config else (key, default, SOURCE_DEFAULT)
        for key, default in sorted(defaults.items())
    ]


async def describe_configs(ctx: KafkaContext, request: Any, version: int) -> Any:
    """DescribeConfigs v1 to v4: the settings (or the keys asked) of each resource, from the node
    port's metadata copy after `wait_metadata_caught_up`: a topic's own values or the node's
    defaults; this node's settings as Kafka's broker configs for a BROKER resource named by its
    id (none for "", the cluster's dynamic defaults, which raftlog has not); the node's group
    settings for a GROUP. Per topic it answers TOPIC_AUTHORIZATION_FAILED without read
    permission, UNKNOWN_TOPIC_OR_PARTITION for an unknown topic (LEADER_NOT_AVAILABLE before
    catch-up); INVALID_REQUEST for another node's id, an empty group name or an unknown resource
    type; broker loggers and client metrics get no entries."""
    module = response_module(DESCRIBE_CONFIGS, version)
    caught_up = await ctx.node.wait_metadata_caught_up()
    documented = bool(getattr(request, "include_documentation", False))
    results = []
    for resource in request.resources:
        code, message, entries = _described(ctx, resource, caught_up)
        keys = resource.configuration_keys
        results.append(
            build(
                module.DescribeConfigsResult,
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=tuple(
                    _config_entry(module, entry, resource.resource_type, documented)
                    for entry in entries
                    if keys is None or entry.name in keys
                ),
            )
        )
    return build(module.DescribeConfigsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


def _config_entry(module: Any, entry: ConfigEntry, resource_type: int, documented: bool) -> Any:
    return build(
        module.DescribeConfigsResourceResult,
        name=entry.name,
        value=entry.value,
        read_only=resource_type != _TOPIC_RESOURCE,  # node and group settings: the node's own
        config_source=entry.source,
        is_default=entry.source == SOURCE_DEFAULT,
        is_sensitive=False,
        synonyms=(),
        config_type=entry.config_type,
        documentation=entry.documentation if documented and entry.documentation else None,
    )


def _described(
    ctx: KafkaContext, resource: Any, caught_up: bool
) -> tuple[ErrorCode, str | None, list[ConfigEntry]]:
    """(error, message, entries) of one resource of a DescribeConfigs."""
    kind, name = resource.resource_type, resource.resource_name
    if kind == _TOPIC_RESOURCE:
        return _described_topic(ctx, name, caught_up)
    if kind in (_BROKER_RESOURCE, _BROKER_LOGGER_RESOURCE) and name not in ("", str(ctx.node_id)):
        return (
            ErrorCode.invalid_request,
            f"Unexpected broker id, expected {ctx.node_id} or empty string, but received {name}",
            [],
        )
    if kind == _BROKER_RESOURCE:
        entries = broker_configs(ctx.node_config, ctx.node_id) if name else []
        return ErrorCode.none, None, entries
    if kind == _GROUP_RESOURCE and not name:
        return ErrorCode.invalid_request, "Group name must not be empty", []
    if kind == _GROUP_RESOURCE:
        return ErrorCode.none, None, group_configs(ctx.node_config)
    if kind in (_BROKER_LOGGER_RESOURCE, _CLIENT_METRICS_RESOURCE):
        return ErrorCode.none, None, []  # raftlog has neither log4j loggers nor client metrics
    return ErrorCode.invalid_request, f"Unsupported resource type: {kind}", []


def _described_topic(
    ctx: KafkaContext, name: str, caught_up: bool
) -> tuple[ErrorCode, str | None, list[ConfigEntry]]:
    if not ctx.allowed(Permission.READ, name):
        return ErrorCode.topic_authorization_failed, "no read permission", []
    info = ctx.node.metadata.state.topic(name) if caught_up else None
    if info is None:
        code = ErrorCode.unknown_topic_or_partition if caught_up else ErrorCode.leader_not_available
        return code, f"unknown topic {name!r}", []
    entries = [
        ConfigEntry(name=key, value=value, source=source, config_type=0, documentation="")
        for key, value, source in topic_configs(ctx, info.config)
    ]
    return ErrorCode.none, None, entries


async def incremental_alter_configs(ctx: KafkaContext, request: Any, version: int) -> Any:
    """IncrementalAlterConfigs v0 to v1: the operations of each topic resource as one
    `AlterTopicConfig` submitted through the node port (`ctx.node.submit`, the controller): SET,
    DELETE, and APPEND or SUBTRACT on a list setting as a SET of the changed list; `validate_only`
    checks this node's copy and commits nothing. Answers INVALID_REQUEST for a key named twice, an
    unknown operation or a non-topic resource, INVALID_CONFIG for APPEND or SUBTRACT on a setting
    that is no list and for a bad value, TOPIC_AUTHORIZATION_FAILED without admin permission,
    NOT_CONTROLLER off the controller, REQUEST_TIMED_OUT."""
    module = response_module(INCREMENTAL_ALTER_CONFIGS, version)
    responses = []
    for resource in request.resources:
        command = _alter_refusal(ctx, resource) or _incremental_command(ctx, resource)
        outcome = (
            command
            if isinstance(command, tuple)
            else await _alter(ctx, command, request.validate_only)
        )
        responses.append(_altered(module, resource, outcome))
    return build(
        module.IncrementalAlterConfigsResponse,
        throttle_time=NO_THROTTLE,
        responses=tuple(responses),
    )


def _incremental_command(ctx: KafkaContext, resource: Any) -> AlterTopicConfig | Outcome:
    """The `AlterTopicConfig` doing a resource's operations, or why there is none."""
    names = [c.name for c in resource.configs]
    if len(set(names)) != len(names):
        return ErrorCode.invalid_request, "Error due to duplicate config keys"
    info = ctx.node.metadata.state.topic(resource.resource_name)
    current = {
        key: value for key, value, _ in topic_configs(ctx, {} if info is None else info.config)
    }
    set_config: dict[str, str] = {}
    delete_keys: list[str] = []
    for change in resource.configs:
        operation, value = change.config_operation, change.value or ""
        if operation == _SET:
            set_config[change.name] = value
        elif operation == _DELETE:
            delete_keys.append(change.name)
        elif operation in (_APPEND, _SUBTRACT) and change.name in _LIST_KEYS:
            items = current[change.name].split(",")
            changed = value.split(",")
            items = (
                items + [v for v in changed if v not in items]
                if operation == _APPEND
                else [v for v in items if v not in changed]
            )
            set_config[change.name] = ",".join(items)
        elif operation in (_APPEND, _SUBTRACT):
            verb = "append" if operation == _APPEND else "subtract"
            return ErrorCode.invalid_config, (
                f"Config value {verb} is not allowed for config key: {change.name}"
            )
        else:
            return ErrorCode.invalid_request, f"unknown operation {operation} on {change.name}"
    return AlterTopicConfig(
        name=resource.resource_name,
        set_config=set_config,
        delete_keys=tuple(sorted(delete_keys)),
    )


async def alter_configs(ctx: KafkaContext, request: Any, version: int) -> Any:
    """AlterConfigs v0 to v2: replaces each topic's whole config through the node port
    (`ctx.node.submit`, the controller), so a key left out goes back to its default; `validate_only`
    checks this node's copy and commits nothing. Answers INVALID_CONFIG for a bad value,
    INVALID_REQUEST for a non-topic resource, TOPIC_AUTHORIZATION_FAILED without admin permission,
    NOT_CONTROLLER off the controller, REQUEST_TIMED_OUT."""
    module = response_module(ALTER_CONFIGS, version)
    responses = []
    for resource in request.resources:
        info = ctx.node.metadata.state.topic(resource.resource_name)
        wanted = {c.name: c.value or "" for c in resource.configs}
        current = info.config if info is not None else {}
        command = AlterTopicConfig(
            name=resource.resource_name,
            set_config=wanted,
            delete_keys=tuple(sorted(k for k in current if k not in wanted)),
        )
        refusal = _alter_refusal(ctx, resource)
        outcome = refusal or await _alter(ctx, command, request.validate_only)
        responses.append(_altered(module, resource, outcome))
    return build(module.AlterConfigsResponse, throttle_time=NO_THROTTLE, responses=tuple(responses))


def _alter_refusal(ctx: KafkaContext, resource: Any) -> Outcome | None:
    """Why a resource's configs may not be altered at all, or None."""
    if resource.resource_type != _TOPIC_RESOURCE:
        return ErrorCode.invalid_request, "only topic configs can be altered"
    if not ctx.allowed(Permission.ADMIN, resource.resource_name):
        return ErrorCode.topic_authorization_failed, "no admin permission"
    return None


async def _alter(ctx: KafkaContext, command: AlterTopicConfig, validate_only: bool) -> Outcome:
    if validate_only:
        refused = check_alter_topic_config(ctx.node.metadata.state, command)
        if refused is None:
            return ErrorCode.none, None
        return metadata_result_error(refused.code), refused.message
    try:
        result = await ctx.node.submit(command, timeout_s=_ALTER_TIMEOUT_S)
    except errors.RaftlogError as error:
        return kafka_error(error), str(error)
    except TimeoutError:
        return ErrorCode.request_timed_out, "not committed in time; it may still be"
    if result.ok:
        return ErrorCode.none, None
    return metadata_result_error(result.code), f"{result.code.value}: {result.message}"


def _altered(module: Any, resource: Any, outcome: Outcome) -> Any:
    code, message = outcome
    return build(
        module.AlterConfigsResourceResponse,
        error_code=code, error_message=message, resource_type=resource.resource_type,
        resource_name=resource.resource_name,
    )  # fmt: skip
