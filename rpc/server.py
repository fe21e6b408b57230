"""A node's grpc.aio server: the `Log`, `Admin`, `Internal` and `Groups` services over the
node port, plus health and reflection, behind the security interceptor (auth,
permissions, per-client limits) and, with --tls-cert/--tls-key, TLS.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from raftlog.metadata.consumer_group_service import ConsumerGroupService
from raftlog.rpc.admin_servicer import AdminServicer, InternalServicer
from raftlog.rpc.consumer_group_servicer import ConsumerGroupServicer
from raftlog.rpc.forwarding import ControllerForwarder
from raftlog.rpc.log_servicer import LogServicer
from raftlog.rpc.port import NodePort
from raftlog.rpc.request_metrics import request_interceptors
from raftlog.rpc.security import security_server_setup
from raftlog.rpc.v1 import raftlog_pb2, raftlog_pb2_grpc
from raftlog.settings import NodeSettings

__all__ = ["ApiServer", "start_api_server"]


@dataclass(slots=True)
class ApiServer:
    server: grpc.aio.Server
    bound_port: int
    # Forwards to the controller with the node's TLS settings and token.
    forward: ControllerForwarder

    async def stop(self) -> None:
        await self.server.stop(grace=0.5)
        await self.forward.close()


async def start_api_server(
    node: NodePort, groups: ConsumerGroupService, settings: NodeSettings
) -> ApiServer:
    message_bytes_max = 2 * settings.config.log.read_bytes_max
    security = security_server_setup(settings)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", message_bytes_max),
            ("grpc.max_send_message_length", message_bytes_max),
            *security.options,
        ],
        interceptors=[*request_interceptors(settings), security.interceptor],
    )
    raftlog_pb2_grpc.add_LogServicer_to_server(LogServicer(node, groups), server)  # type: ignore[no-untyped-call]
    raftlog_pb2_grpc.add_AdminServicer_to_server(AdminServicer(node), server)  # type: ignore[no-untyped-call]
    raftlog_pb2_grpc.add_InternalServicer_to_server(InternalServicer(node), server)  # type: ignore[no-untyped-call]
    consumer_groups = ConsumerGroupServicer(groups, node.leader_address)
    raftlog_pb2_grpc.add_GroupsServicer_to_server(consumer_groups, server)  # type: ignore[no-untyped-call]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    services = [
        raftlog_pb2.DESCRIPTOR.services_by_name[name].full_name
        for name in ("Log", "Admin", "Internal", "Groups")
    ]
    reflection.enable_server_reflection(
        [*services, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    host, port = settings.listen
    if security.credentials is not None:
        bound_port = server.add_secure_port(f"{host}:{port}", security.credentials)
    else:
        bound_port = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    forward = ControllerForwarder(
        credentials=security.channel_credentials, token=security.node_token
    )
    return ApiServer(server, bound_port, forward)
