package streamstate.kstreams;

import com.fasterxml.jackson.annotation.JsonProperty;

/** A sales_by_category window's value: {"units": int, "revenue": number}. */
public final class SalesTotal {
  @JsonProperty("units")
  public long units;

  @JsonProperty("revenue")
  public double revenue;

  public SalesTotal add(Sale sale) {
    units += sale.units;
    revenue += sale.revenue;
    return this;
  }
}
