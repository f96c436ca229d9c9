"""The interactive-query layer: a FastAPI app served inside every worker."""

from api.app import create_api

__all__ = ["create_api"]
