"""The server describes itself with OpenRPC (rpc.discover, behind a token): Litestar's own
OpenAPI pages, served without a token and loading their scripts from a CDN, are off."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.parametrize(
    "path",
    [
        "/schema",
        "/schema/openapi.json",
        "/schema/openapi.yaml",
        "/schema/swagger",
        "/schema/redoc",
        "/schema/elements",
        "/schema/rapidoc",
    ],
)
async def test_no_openapi_pages(shared_client: Any, path: str) -> None:
    response = await shared_client.get(path)
    assert response.status_code == 404, (path, response.status_code, response.text[:200])
    assert "openapi" not in response.text.lower()
