package streamstate.jobs;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF3;

/**
 * Parses and validates an item event in the plain form, in the JVM.
 *
 * <p>The plain form is a flat JSON object whose members are fields of the item-event schema
 * ({@code app/models.py} ItemEvent), each with a value of its JSON type: strings of printable
 * ASCII without escapes, integers without fraction or exponent for quantity and ts, a number or
 * null for unit_price. JSON whitespace is allowed between tokens, and a field given twice counts
 * with its last value, as in the stream.
 *
 * <p>Returns null for any record that is not in the plain form (another field, an escape, a
 * non-ASCII character, another type, nesting, bad JSON): the caller hands those to the stream's
 * own Python validation. Otherwise a row {@code (ok, event_id, store_id, sku, kind, quantity,
 * unit_price, ts)} where {@code ok} is the schema's verdict, restated here: every rule of
 * ItemEvent and the key check of the topic. Its Spark SQL type is registered with the class
 * ({@code JAVA_UDFS} in {@code jobs/session.py}).
 */
public final class PlainItemEvent implements UDF3<byte[], byte[], Integer, Row> {
  private static final long serialVersionUID = 1L;

  private static final Row INVALID =
      RowFactory.create(false, null, null, null, null, null, null, null);

  private transient ItemEventParser parser;

  @Override
  public Row call(byte[] key, byte[] value, Integer maxBytes) {
    if (parser == null) {
      parser = new ItemEventParser();
    }
    ItemEventParser p = parser;
    switch (p.parse(key, value, maxBytes)) {
      case ItemEventParser.VALID:
        return RowFactory.create(
            true, p.eventId, p.storeId, p.sku, p.kind, p.quantity, p.unitPrice, p.ts);
      case ItemEventParser.INVALID:
        return INVALID;
      default:
        return null;
    }
  }
}
