"""gRPC server reflection, so that grpcurl and similar tools work without our .proto files: the
services the node serves, and the descriptors (with their dependencies) of the files that
define them.

Served as both `grpc.reflection.v1.ServerReflection` and the older
`grpc.reflection.v1alpha.ServerReflection`: the two have the same messages, so both are read
with the v1alpha classes. Only the files of the node's services and what they import are
described; any other name is answered with NOT_FOUND in the stream (not by ending it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import DecodeError
from grpc_reflection.v1alpha import reflection_pb2

from mop.protocols.grpc.serving.calls import Call, MethodHandler
from mop.protocols.grpc.status import GrpcError, StatusCode

__all__ = ["REFLECTION_SERVICES", "reflection_methods"]

_V1ALPHA: Final = "grpc.reflection.v1alpha.ServerReflection"
_V1: Final = "grpc.reflection.v1.ServerReflection"
REFLECTION_SERVICES: Final = (_V1, _V1ALPHA)
_METHOD: Final = "ServerReflectionInfo"


@dataclass(frozen=True, slots=True)
class _Catalog:
    """What reflection may describe: the files by name (serialized FileDescriptorProto), the
    direct dependencies of each, and the file defining each symbol."""

    files: dict[str, bytes]
    dependencies: dict[str, tuple[str, ...]]
    symbols: dict[str, str]
    services: tuple[str, ...]

    def closure(self, name: str) -> list[bytes]:
        """The file `name` first, then every file it imports, directly or not."""
        order: list[str] = []
        pending = [name]
        while pending:
            current = pending.pop(0)
            if current in order or current not in self.files:
                continue
            order.append(current)
            pending.extend(self.dependencies[current])
        return [self.files[file] for file in order]


def _catalog(services: Iterable[str]) -> _Catalog:
    pool = descriptor_pool.Default()
    files: dict[str, bytes] = {}
    dependencies: dict[str, tuple[str, ...]] = {}
    symbols: dict[str, str] = {}

    def add(file: FileDescriptor) -> None:
        if file.name in files:
            return
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        _add_proto(proto, files, dependencies, symbols)
        for dependency in file.dependencies:
            add(dependency)

    names = sorted(services)
    for service in names:
        if service == _V1:
            continue  # described below, from the v1alpha file
        add(pool.FindServiceByName(service).file)
    if _V1 in names:
        # v1's file is v1alpha's with another package: described as such rather than shipped.
        proto = descriptor_pb2.FileDescriptorProto()
        reflection_pb2.DESCRIPTOR.CopyToProto(proto)
        proto.name = "grpc/reflection/v1/reflection.proto"
        proto.package = "grpc.reflection.v1"
        _add_proto(proto, files, dependencies, symbols)
    return _Catalog(files, dependencies, symbols, tuple(names))


def _add_proto(
    proto: descriptor_pb2.FileDescriptorProto,
    files: dict[str, bytes],
    dependencies: dict[str, tuple[str, ...]],
    symbols: dict[str, str],
) -> None:
    files[proto.name] = proto.SerializeToString()
    dependencies[proto.name] = tuple(proto.dependency)
    prefix = f"{proto.package}." if proto.package else ""
    for service in proto.service:
        symbols[prefix + service.name] = proto.name
        for method in service.method:
            symbols[f"{prefix}{service.name}.{method.name}"] = proto.name
    for enum in proto.enum_type:
        symbols[prefix + enum.name] = proto.name
    for message in proto.message_type:
        _add_message(prefix, message, proto.name, symbols)


def _add_message(
    prefix: str, message: descriptor_pb2.DescriptorProto, file: str, symbols: dict[str, str]
) -> None:
    name = prefix + message.name
    symbols[name] = file
    for field in message.field:
        symbols[f"{name}.{field.name}"] = file
    for enum in message.enum_type:
        symbols[f"{name}.{enum.name}"] = file
    for nested in message.nested_type:
        _add_message(name + ".", nested, file, symbols)


def reflection_methods(services: Iterable[str]) -> dict[str, MethodHandler]:
    """The reflection service's handlers (v1 and v1alpha) describing `services` (the node's
    services by full name; the reflection services themselves are added)."""
    catalog = _catalog([*services, *REFLECTION_SERVICES])

    async def info(call: Call) -> None:
        while (data := await call.receive()) is not None:
            try:
                request = reflection_pb2.ServerReflectionRequest.FromString(data)
            except DecodeError as exc:
                raise GrpcError(
                    StatusCode.INVALID_ARGUMENT, f"bad ServerReflectionRequest: {exc}"
                ) from None
            await call.send(_answer(catalog, request).SerializeToString())

    return {f"/{service}/{_METHOD}": info for service in REFLECTION_SERVICES}


def _answer(
    catalog: _Catalog, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    response = reflection_pb2.ServerReflectionResponse(
        valid_host=request.host, original_request=request
    )
    kind = request.WhichOneof("message_request")
    if kind == "list_services":
        for service in catalog.services:
            response.list_services_response.service.add(name=service)
    elif kind == "file_by_filename" and request.file_by_filename in catalog.files:
        response.file_descriptor_response.file_descriptor_proto.extend(
            catalog.closure(request.file_by_filename)
        )
    elif kind == "file_containing_symbol" and request.file_containing_symbol in catalog.symbols:
        response.file_descriptor_response.file_descriptor_proto.extend(
            catalog.closure(catalog.symbols[request.file_containing_symbol])
        )
    elif (
        kind == "all_extension_numbers_of_type"
        and request.all_extension_numbers_of_type in catalog.symbols
    ):
        # None of the node's messages has extensions.
        response.all_extension_numbers_response.base_type_name = (
            request.all_extension_numbers_of_type
        )
    else:
        # An unknown file, symbol or type, an extension (the node's files define none), or a
        # request of a kind this server does not know.
        wanted = getattr(request, kind) if kind else ""
        response.error_response.error_code = int(StatusCode.NOT_FOUND)
        response.error_response.error_message = f"{kind or 'request'} {wanted!r} not found"
    return response
