"""Wire schemas of the source topics, validated strictly.

Pure pydantic (no faust), so that the batch job validates records exactly as the
stream does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

NonEmpty = Annotated[str, Field(min_length=1, max_length=256)]
EpochMs = Annotated[StrictInt, Field(ge=0, le=253_402_300_799_999)]  # up to year 9999


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class ItemEvent(_Wire):
    """A store event on ``item-events``: a sale, a restock or a stock adjustment."""

    event_id: NonEmpty
    store_id: NonEmpty
    sku: NonEmpty
    kind: Literal["sale", "restock", "adjust"]
    quantity: Annotated[StrictInt, Field(ge=-1_000_000, le=1_000_000)]
    unit_price: Annotated[float, Field(allow_inf_nan=False, ge=0, le=1e9)] | None = None
    ts: EpochMs

    @model_validator(mode="after")
    def _check_kind(self) -> ItemEvent:
        if self.kind in ("sale", "restock") and self.quantity <= 0:
            raise ValueError(f"quantity must be > 0 for {self.kind}, got {self.quantity}")
        if self.kind == "adjust" and self.quantity == 0:
            raise ValueError("quantity must be non-zero for adjust")
        if self.kind == "sale" and self.unit_price is None:
            raise ValueError("unit_price is required for a sale")
        return self


class Product(_Wire):
    """A catalogue record on the compacted ``products`` topic."""

    sku: NonEmpty
    name: Annotated[str, Field(max_length=1024)]
    category: NonEmpty


class Payment(_Wire):
    """A payment on ``payments``, settling the sale whose event_id is sale_event_id."""

    payment_id: NonEmpty
    sale_event_id: NonEmpty
    store_id: NonEmpty
    amount: Annotated[float, Field(allow_inf_nan=False, ge=0, le=1e12)]
    ts: EpochMs


class Correction(_Wire):
    """A repair on ``corrections``: the batch value of one table key."""

    table: NonEmpty
    key: Annotated[str, Field(min_length=1, max_length=4096)]
    value: Any = None
