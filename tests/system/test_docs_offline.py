"""``/docs`` and ``/redoc`` work without internet on every service: the pages name no external
URL, and every asset they reference is served by the service itself."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.support.cluster import Cluster, all_services

pytestmark = pytest.mark.integration

__all__ = ["all_services"]  # the fixture, imported for this module

SERVICES = ("broker", "nameserver", "scheduler", "checker", "metrics")
ASSET_RE = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
SPEC_RE = re.compile(r"""(?:url:\s*|spec-url=)["']([^"']+)["']""")


def _page(http: httpx.Client, path: str) -> tuple[list[str], str]:
    resp = http.get(path)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/html")
    html = resp.text
    assert "://" not in html, f"{path} names an external URL: {html}"
    assets = ASSET_RE.findall(html)
    (spec,) = SPEC_RE.findall(html)
    return assets, spec


@pytest.mark.parametrize("service", SERVICES)
def test_docs_pages_load_everything_from_the_service(all_services: Cluster,
                                                     service: str) -> None:
    with httpx.Client(base_url=all_services.urls()[service], timeout=10.0) as http:
        docs_assets, spec = _page(http, "/docs")
        assert any(a.endswith(".js") for a in docs_assets)
        assert any(a.endswith(".css") for a in docs_assets)
        redoc_assets, redoc_spec = _page(http, "/redoc")
        assert any(a.endswith(".js") for a in redoc_assets)
        for asset in {*docs_assets, *redoc_assets}:
            assert asset.startswith("/"), asset
            resp = http.get(asset)
            assert resp.status_code == 200, (asset, resp.status_code)
            assert len(resp.content) > 100, asset
        for url in {spec, redoc_spec}:
            document = http.get(url).json()
            assert document["openapi"].startswith("3.1") and document["paths"]


def test_the_swagger_ui_served_renders_openapi_3_1(all_services: Cluster) -> None:
    """FastAPI writes OpenAPI 3.1, which Swagger UI renders from version 5 on (an older bundle
    shows "Unable to render this definition")."""
    with httpx.Client(base_url=all_services.broker.url, timeout=10.0) as http:
        assets, _ = _page(http, "/docs")
        (script,) = [a for a in assets if a.endswith(".js")]
        bundle = http.get(script).text
    version = re.search(r'PACKAGE_VERSION:"(\d+)\.', bundle)
    assert version is not None and int(version.group(1)) >= 5
