"""What a `POST /api/v1/publish` body may hold."""

from __future__ import annotations

from typing import Any

import pytest

from mop.admin.http import HttpError
from mop.admin.routes_publish import publish_request


@pytest.mark.parametrize("qos", [1.0, 0.0, True, 2, -1, "1", None])
def test_qos_is_the_integer_0_or_1(qos: Any) -> None:
    with pytest.raises(HttpError) as refused:
        publish_request({"topic": "a/b", "qos": qos})
    assert refused.value.status == 400


def test_integer_qos_is_taken() -> None:
    assert publish_request({"topic": "a/b", "qos": 1}).qos == 1
    assert publish_request({"topic": "a/b"}).qos == 0
