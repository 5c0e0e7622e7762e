"""The checked-in Python code of mop's .proto is what the documented protoc command makes of
it (so a change to the .proto cannot ship without its code)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mop.protocols.grpc.proto as proto_package

ROOT = Path(__file__).resolve().parents[4]
PROTO = Path("mop/protocols/grpc/proto/mop_grpc.proto")


def test_the_generated_code_is_up_to_date(tmp_path: Path) -> None:
    # The command of `mop.protocols.grpc.proto`'s docstring, with the output in tmp_path.
    assert "python -m grpc_tools.protoc -I . --python_out=. --pyi_out=." in " ".join(
        (proto_package.__doc__ or "").split()
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            ".",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(PROTO),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    for name in ("mop_grpc_pb2.py", "mop_grpc_pb2.pyi"):
        generated = (tmp_path / PROTO.parent / name).read_text()
        checked_in = (ROOT / PROTO.parent / name).read_text()
        assert generated == checked_in, f"{name} is not what protoc makes of {PROTO.name}"
