package streamstate.kstreams;

import com.fasterxml.jackson.annotation.JsonProperty;

/** One sale on its way to its category's window: the repartition record's value. */
public final class Sale {
  @JsonProperty("units")
  public long units;

  @JsonProperty("revenue")
  public double revenue;

  /** Not written: the category is the repartition record's key. */
  public transient String category;

  public Sale() {}

  public Sale(String category, long units, double revenue) {
    this.category = category;
    this.units = units;
    this.revenue = revenue;
  }
}
