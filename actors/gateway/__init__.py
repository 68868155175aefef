"""The REST gateway: the Admin API over HTTP (``server``), its route table (``routes``),
documents (``documents``), OpenAPI document (``openapi``) and web console (``console``,
files in ``static``). It reaches the cluster only through the admin service."""
