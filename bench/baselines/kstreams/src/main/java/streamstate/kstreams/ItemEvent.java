package streamstate.kstreams;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * A valid store event of {@code item-events}, validated as {@code core/models.py} does, with
 * its record value as it came.
 */
public final class ItemEvent {
  /** The largest accepted record value, in bytes (STREAMSTATE_MAX_EVENT_BYTES' default). */
  public static final int MAX_BYTES = 64 * 1024;

  public final String eventId;
  public final String storeId;
  public final String sku;
  public final String kind;
  public final long quantity;
  public final Double unitPrice;
  public final long ts;
  /** The record value, as JSON text. */
  public final String json;

  private ItemEvent(JsonNode root, String json) throws InvalidEvent {
    eventId = Fields.text(root, "event_id", 256);
    storeId = Fields.text(root, "store_id", 256);
    sku = Fields.text(root, "sku", 256);
    JsonNode kindNode = root.get("kind");
    if (kindNode == null || !kindNode.isTextual()) {
      throw new InvalidEvent("kind: input should be 'sale', 'restock' or 'adjust'");
    }
    kind = kindNode.textValue();
    if (!kind.equals("sale") && !kind.equals("restock") && !kind.equals("adjust")) {
      throw new InvalidEvent("kind: input should be 'sale', 'restock' or 'adjust'");
    }
    quantity = Fields.integer(root, "quantity", -1_000_000, 1_000_000);
    unitPrice = Fields.number(root, "unit_price", 0, 1e9, true);
    ts = Fields.integer(root, "ts", 0, Fields.MAX_EPOCH_MS);
    if (!kind.equals("adjust") && quantity <= 0) {
      throw new InvalidEvent("quantity must be > 0 for " + kind + ", got " + quantity);
    }
    if (kind.equals("adjust") && quantity == 0) {
      throw new InvalidEvent("quantity must be non-zero for adjust");
    }
    if (kind.equals("sale") && unitPrice == null) {
      throw new InvalidEvent("unit_price is required for a sale");
    }
    this.json = json;
  }

  /** The event of a record, or InvalidEvent: the record's key must be its store_id. */
  public static ItemEvent parse(byte[] key, byte[] value) throws InvalidEvent {
    String text = Records.text(value, MAX_BYTES);
    ItemEvent event = new ItemEvent(Fields.object(Json.tree(text)), text);
    Records.checkKey(key, event.storeId, "store_id");
    return event;
  }

  public boolean isSale() {
    return kind.equals("sale");
  }

  /** How the event changes on-hand stock: a sale subtracts, restock and adjust add. */
  public long stockDelta() {
    return kind.equals("sale") ? -quantity : quantity;
  }

  /** quantity x unit_price of a sale. */
  public double revenue() {
    return quantity * (unitPrice == null ? 0.0 : unitPrice);
  }

  /** The event's store_id as the bytes of its record key. */
  public byte[] storeKey() {
    return storeId.getBytes(StandardCharsets.UTF_8);
  }

  @Override
  public String toString() {
    return "ItemEvent" + Arrays.asList(eventId, storeId, sku, kind, quantity, unitPrice, ts);
  }
}
