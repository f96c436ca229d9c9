package streamstate.kstreams;

import com.fasterxml.jackson.databind.JsonNode;

/** A valid payment of {@code payments}, validated as {@code core/models.py} does. */
public final class Payment {
  public final String paymentId;
  public final String saleEventId;
  public final String storeId;
  public final double amount;
  public final long ts;
  /** The record value, as JSON text. */
  public final String json;

  private Payment(JsonNode root, String json) throws InvalidEvent {
    paymentId = Fields.text(root, "payment_id", 256);
    saleEventId = Fields.text(root, "sale_event_id", 256);
    storeId = Fields.text(root, "store_id", 256);
    amount = Fields.number(root, "amount", 0, 1e12, false);
    ts = Fields.integer(root, "ts", 0, Fields.MAX_EPOCH_MS);
    this.json = json;
  }

  /** The payment of a record, or InvalidEvent: the record's key must be its store_id. */
  public static Payment parse(byte[] key, byte[] value) throws InvalidEvent {
    String text = Records.text(value, ItemEvent.MAX_BYTES);
    Payment payment = new Payment(Fields.object(Json.tree(text)), text);
    Records.checkKey(key, payment.storeId, "store_id");
    return payment;
  }
}
