"""Create and list ACL bindings on a cluster, with the Kafka protocol's own CreateAcls and
DescribeAcls requests.

aiokafka's admin client has no ``create_acls`` or ``describe_acls`` (kafka-python's had); it
does ship the protocol's ``CreateAclsRequest`` and ``DescribeAclsRequest`` (v0-v1 negotiated;
Kafka 4 serves v1-v3), and the admin client sends any request through its private
``_send_request``. That private call is this module's only reliance on aiokafka internals;
``tests/unit/test_kafka_acls_model.py`` pins it by name. The codes
are Kafka's own enums (``org.apache.kafka.common.resource.ResourceType``, ``PatternType``,
``org.apache.kafka.common.acl.AclOperation``, ``AclPermissionType``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from aiokafka.errors import for_code
from aiokafka.protocol.admin import CreateAclsRequest, DescribeAclsRequest

from pipeline.errors import PipelineError
from pipeline.kafka.clients import admin_client
from pipeline.settings import KafkaSettings

RESOURCE_TYPE = {"topic": 2, "group": 3, "transactional-id": 5}
PATTERN_TYPE = {"literal": 3, "prefix": 4}
OPERATION = {"Read": 3, "Write": 4, "Create": 5, "Delete": 6, "Describe": 8}
ALLOW = 3
ANY = 1
ANY_HOST = "*"


class AclBinding(NamedTuple):
    """One ALLOW binding from any host: ``principal`` may do ``operation`` on the resource."""

    principal: str
    resource_type: str
    """``topic`` or ``group``."""
    name: str
    pattern: str
    """``literal``, or ``prefix``: every resource whose name starts with ``name``."""
    operation: str
    """Kafka's name: ``Read``, ``Write``, ``Create``, ``Delete``, ``Describe``."""


class AclsRefused(PipelineError):
    """The cluster refused to create a binding (most often: the caller is not allowed to alter ACLs)."""


async def create_acls(settings: KafkaSettings, bindings: Sequence[AclBinding]) -> int:
    """Create every binding; returns how many were created.

    Creating a binding that exists already succeeds, so applying twice is harmless."""
    async with admin_client(settings) as admin:
        for binding in bindings:
            request = CreateAclsRequest(
                RESOURCE_TYPE[binding.resource_type],
                binding.name,
                PATTERN_TYPE[binding.pattern],
                binding.principal,
                ANY_HOST,
                OPERATION[binding.operation],
                ALLOW,
            )
            response = await admin._send_request(request)
            for error_code, message in response.creation_responses:
                if error_code:
                    raise AclsRefused(_refusal(binding, error_code, message))
    return len(bindings)


async def principal_acls(settings: KafkaSettings, principals: Sequence[str]) -> set[AclBinding]:
    """Every binding the cluster holds for ``principals`` (one DescribeAcls each: any
    resource, pattern, operation, host and permission). One that is not an ALLOW from any
    host, as :func:`create_acls` makes them, comes back with its principal marked
    ``(host, permission code)``, so it never equals an expected binding."""
    resource_types = {code: name for name, code in RESOURCE_TYPE.items()}
    patterns = {code: name for name, code in PATTERN_TYPE.items()}
    operations = {code: name for name, code in OPERATION.items()}
    found: set[AclBinding] = set()
    async with admin_client(settings) as admin:
        for principal in principals:
            request = DescribeAclsRequest(ANY, None, ANY, principal, None, ANY, ANY)
            response = await admin._send_request(request)
            if response.error_code:
                raise AclsRefused(
                    f"the broker refused to list the ACLs of {principal}: {for_code(response.error_code).__name__}"
                )
            for resource_type, name, pattern, acls in response.resources:
                for acl_principal, host, operation, permission in acls:
                    found.add(
                        AclBinding(
                            acl_principal
                            if host == ANY_HOST and permission == ALLOW
                            else f"{acl_principal} ({host}, {permission})",
                            resource_types.get(resource_type, str(resource_type)),
                            name,
                            patterns.get(pattern, str(pattern)),
                            operations.get(operation, str(operation)),
                        )
                    )
    return found


_CLUSTER_AUTHORIZATION_FAILED = 31
#: Past this, a broker's message is its internal request dump, not a reason for a person.
_MESSAGE_CHARS = 160


def _refusal(binding: AclBinding, error_code: int, message: str | None) -> str:
    what = f"the broker refused to allow {binding.principal} {binding.operation} on {binding.resource_type} {binding.name!r}"
    if error_code == _CLUSTER_AUTHORIZATION_FAILED:
        return f"{what}: ClusterAuthorizationFailedError: only a principal with Alter on the cluster (an admin) may create ACLs"
    reason = (message or "").strip()
    return f"{what}: {for_code(error_code).__name__}" + (
        f": {reason}" if reason and len(reason) <= _MESSAGE_CHARS else ""
    )
