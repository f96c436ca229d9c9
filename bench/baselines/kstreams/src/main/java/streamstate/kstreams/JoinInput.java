package streamstate.kstreams;

/** A record of either side of the settling join, as the join needs it. */
public final class JoinInput {
  /** True for item-events (the sales side), false for payments. */
  public final boolean left;

  public final long ts;
  /** A sale's event_id or a payment's sale_event_id; null for a restock or adjustment. */
  public final String joinKey;

  public final String storeId;
  public final String json;

  private JoinInput(boolean left, long ts, String joinKey, String storeId, String json) {
    this.left = left;
    this.ts = ts;
    this.joinKey = joinKey;
    this.storeId = storeId;
    this.json = json;
  }

  /** A store event: a sale joins, the others only move the sales side's event time. */
  public static JoinInput of(ItemEvent event) {
    return new JoinInput(
        true, event.ts, event.isSale() ? event.eventId : null, event.storeId, event.json);
  }

  public static JoinInput of(Payment payment) {
    return new JoinInput(false, payment.ts, payment.saleEventId, payment.storeId, payment.json);
  }
}
