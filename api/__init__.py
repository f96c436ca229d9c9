"""The interactive-query layer: a FastAPI app served inside every worker.

``create_api`` is imported on first use: the worker serves key reads and readiness
(api/front.py, api/fastpath.py) before FastAPI's modules are imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from api.app import create_api

__all__ = ["create_api"]


def __getattr__(name: str) -> Any:
    if name == "create_api":
        from api.app import create_api

        return create_api
    raise AttributeError(f"module 'api' has no attribute {name!r}")
