"""A static member's clean stop leaves its group (pipeline/kafka/static_leave.py).

The request is LeaveGroup v3 as Kafka's protocol defines it (checked here byte for byte
against the message's schema: ``LeaveGroupRequest.json``), built on aiokafka's protocol
base classes, and sent with the admin client's ``_send_request_to_node``: those aiokafka
internals are pinned here by name, so an upgrade that moves them fails this test first.
That the broker honours it is shown on Apache Kafka by
``tests/integration/test_static_membership.py::test_a_static_member_stopped_for_good_hands_its_partitions_on_at_once``.
"""

from __future__ import annotations

import asyncio
import struct

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from pipeline.cli.kafka_props import kafka_environment, property_fields
from pipeline.kafka.static_leave import (
    LeaveGroupResponse_v3,
    StaticMemberLeave,
    leave_errors,
    leave_on_stop,
)
from pipeline.settings import KafkaSettings


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def test_the_request_is_leave_group_v3_naming_the_instance() -> None:
    request = StaticMemberLeave("g-1", ["pod-0"]).prepare({13: (0, 5)})
    assert (request.API_KEY, request.API_VERSION) == (13, 3)
    # group_id, then members: [member_id (unknown: ""), group_instance_id]
    assert request.encode() == _string("g-1") + struct.pack(">i", 1) + _string("") + _string("pod-0")


def test_a_broker_without_v3_is_refused_rather_than_sent_a_leave_that_names_no_one() -> None:
    with pytest.raises(NotImplementedError, match="StaticMemberLeave"):
        StaticMemberLeave("g-1", ["pod-0"]).prepare({13: (0, 2)})


def test_the_answer_names_what_the_coordinator_refused() -> None:
    ok = LeaveGroupResponse_v3(0, 0, [("m-1", "pod-0", 0)])
    assert leave_errors(ok) == []
    unknown = LeaveGroupResponse_v3(0, 0, [("", "pod-0", 25)])  # UNKNOWN_MEMBER_ID
    assert leave_errors(unknown) == ["pod-0: UnknownMemberIdError"]
    decoded = LeaveGroupResponse_v3.decode(
        struct.pack(">ihi", 0, 0, 1) + _string("m-1") + _string("pod-0") + struct.pack(">h", 0)
    )
    assert leave_errors(decoded) == [] and decoded.members == [("m-1", "pod-0", 0)]


def test_only_a_static_member_with_the_setting_on_leaves() -> None:
    assert leave_on_stop(KafkaSettings(), "g") is None  # dynamic: aiokafka's own leave
    assert leave_on_stop(KafkaSettings(group_instance_id="pod-0", leave_group_on_stop=False), "g") is None
    leave = leave_on_stop(KafkaSettings(group_instance_id="pod-0"), "g")
    assert asyncio.iscoroutine(leave)
    leave.close()  # not awaited here: no broker


def test_the_java_property_name_turns_it_off() -> None:
    env = kafka_environment(property_fields([("internal.leave.group.on.close", "false")]))
    assert env == {"PIPELINE_KAFKA_LEAVE_GROUP_ON_STOP": "false"}
    assert KafkaSettings.model_validate({"leave_group_on_stop": "false"}).leave_group_on_stop is False


def test_the_aiokafka_internals_it_uses_are_there() -> None:
    assert callable(AIOKafkaAdminClient._send_request_to_node)
    assert callable(AIOKafkaAdminClient.find_coordinator)
