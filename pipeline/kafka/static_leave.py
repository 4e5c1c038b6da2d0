"""A static member leaves its consumer group on a clean stop (KIP-345's member removal).

A static member (``group.instance.id``) that is killed keeps its partitions until its
session times out, so a worker restarted under the same name gets them back without a
rebalance: that is what static membership is for. On a clean stop (SIGTERM) the trade is
the other way round. A stop is a scale-down or a rolling replacement, and a Kubernetes pod
takes longer than a session timeout to come back; waiting out the session leaves its
partitions unserved meanwhile. So on a clean stop a static member leaves, and its
partitions move at once, as a dynamic member's do (``PIPELINE_KAFKA_LEAVE_GROUP_ON_STOP``,
``-X internal.leave.group.on.close``: true by default; false keeps them through a planned
restart shorter than the session).

aiokafka's consumer never sends LeaveGroup for a static member, and its protocol module
stops at LeaveGroup v1, which cannot name one. A static member is removed by LeaveGroup
v3 (Kafka 2.4+), naming the group instance with an unknown member ID, the way the Java
admin client's ``removeMembersFromConsumerGroup`` does. It is sent by an admin client after
the consumer has stopped (so it does not join again) to the group's coordinator. aiokafka
internals used: the request base classes and the admin client's ``_send_request_to_node``,
pinned by name in ``tests/unit/test_static_leave.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String

from pipeline.settings import KafkaSettings

log = logging.getLogger(__name__)

LEAVE_TIMEOUT_MS = 5_000
UNKNOWN_MEMBER_ID = ""  # the coordinator finds a static member by its instance ID


class LeaveGroupResponse_v3(Response):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")), ("error_code", Int16)),
        ),
    )


class LeaveGroupRequest_v3(RequestStruct):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


class StaticMemberLeave(Request[LeaveGroupRequest_v3]):  # type: ignore[misc]
    """LeaveGroup for group instances (v3, the first version that names them)."""

    API_KEY = 13

    def __init__(self, group_id: str, instance_ids: list[str]) -> None:
        self._group_id = group_id
        self._instance_ids = instance_ids

    def build(self, request_struct_class: type[LeaveGroupRequest_v3]) -> LeaveGroupRequest_v3:
        return request_struct_class(self._group_id, [(UNKNOWN_MEMBER_ID, i) for i in self._instance_ids])


def leave_errors(response: LeaveGroupResponse_v3) -> list[str]:
    """What the coordinator refused, as error names (empty: every instance left)."""
    errors = [] if response.error_code == 0 else [for_code(response.error_code).__name__]
    return errors + [f"{instance}: {for_code(code).__name__}" for _, instance, code in response.members if code != 0]


async def leave_as_static_member(settings: KafkaSettings, group_id: str, instance_id: str) -> bool:
    """Remove ``instance_id`` from ``group_id`` so its partitions move now; True when the
    coordinator confirmed it. Best effort, as aiokafka's own leave is: a failure is logged
    and the partitions move when the session times out, as before."""
    admin = AIOKafkaAdminClient(**settings.client_kwargs(), request_timeout_ms=LEAVE_TIMEOUT_MS)
    try:
        await admin.start()
        coordinator = await admin.find_coordinator(group_id)
        response = await admin._send_request_to_node(coordinator, StaticMemberLeave(group_id, [instance_id]))
    except Exception as exc:  # noqa: BLE001 - best effort: the session expiry still moves them
        log.warning(
            "group %s: %s could not leave (%r); its partitions move after its session", group_id, instance_id, exc
        )
        return False
    finally:
        await admin.close()
    if errors := leave_errors(response):
        log.warning(
            "group %s: %s could not leave (%s); its partitions move after its session", group_id, instance_id, errors
        )
        return False
    log.info("group %s: static member %s left; its partitions move now", group_id, instance_id)
    return True


def leave_on_stop(settings: KafkaSettings, group_id: str) -> Awaitable[bool] | None:
    """What a stage's clean stop awaits after its consumer stopped: the static member's
    leave, or None (a dynamic member left already; ``leave_group_on_stop`` false)."""
    if not settings.group_instance_id or not settings.leave_group_on_stop:
        return None
    return leave_as_static_member(settings, group_id, settings.group_instance_id)
