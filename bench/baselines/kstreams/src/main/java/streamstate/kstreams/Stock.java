package streamstate.kstreams;

import com.fasterxml.jackson.annotation.JsonProperty;
import java.util.HashMap;
import java.util.Map;

/** The inventory table's value: {"store_id", "on_hand": {sku: int}, "updated_at": int}. */
public final class Stock {
  @JsonProperty("store_id")
  public String storeId;

  @JsonProperty("on_hand")
  public Map<String, Long> onHand = new HashMap<>();

  /** The largest ts applied; null before the first event. */
  @JsonProperty("updated_at")
  public Long updatedAt;

  /** This stock after one event: sale subtracts, restock adds, adjust adds its sign. */
  public Stock apply(ItemEvent event) {
    storeId = event.storeId;
    onHand.merge(event.sku, event.stockDelta(), Long::sum);
    updatedAt = updatedAt == null ? event.ts : Math.max(updatedAt, event.ts);
    return this;
  }
}
