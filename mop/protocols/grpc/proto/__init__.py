"""mop's gRPC service definition (`mop_grpc.proto`, shipped in the package so that users
generate clients in their language) and the Python code generated from it, checked in.

Regenerate after changing the .proto, from the repository's root:

    python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. \
        mop/protocols/grpc/proto/mop_grpc.proto

(`grpcio-tools`, a test dependency; a test checks that the checked-in code is what this
command makes.)
"""
