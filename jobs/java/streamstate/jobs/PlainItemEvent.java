package streamstate.jobs;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

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

  static final int TEXT_MAX = 256;
  static final long QUANTITY_LIMIT = 1_000_000L;
  static final double PRICE_MAX = 1e9;
  static final long TS_MAX = 253_402_300_799_999L;

  private static final Row INVALID =
      RowFactory.create(false, null, null, null, null, null, null, null);

  /** Field numbers. */
  private static final int EVENT_ID = 0, STORE_ID = 1, SKU = 2, KIND = 3;
  private static final int QUANTITY = 4, UNIT_PRICE = 5, TS = 6, UNKNOWN = -1;

  @Override
  public Row call(byte[] key, byte[] value, Integer maxBytes) {
    if (value == null || value.length > maxBytes) {
      return INVALID; // both are rejected before any parsing in the stream too
    }
    return new Parser(value).event(key);
  }

  /** One record's parse; a method returning null means "not in the plain form". */
  private static final class Parser {
    private final byte[] in;
    private int at;
    private final String[] text = new String[4];
    private long quantity, ts;
    private boolean hasQuantity, hasTs;
    private Double unitPrice;

    Parser(byte[] in) {
      this.in = in;
    }

    Row event(byte[] key) {
      skipSpace();
      if (!take('{')) {
        return null;
      }
      skipSpace();
      if (take('}')) {
        return end() ? INVALID : null; // {} lacks every required field
      }
      do {
        skipSpace();
        if (!member()) {
          return null;
        }
        skipSpace();
      } while (take(','));
      if (!take('}') || !end()) {
        return null;
      }
      return verdict(key);
    }

    private boolean member() {
      int field = fieldName();
      if (field == UNKNOWN) {
        return false;
      }
      skipSpace();
      if (!take(':')) {
        return false;
      }
      skipSpace();
      switch (field) {
        case QUANTITY:
        case TS:
          Long number = integer();
          if (number == null) {
            return false;
          }
          if (field == QUANTITY) {
            quantity = number;
            hasQuantity = true;
          } else {
            ts = number;
            hasTs = true;
          }
          return true;
        case UNIT_PRICE:
          return price();
        default:
          String string = string();
          if (string == null) {
            return false;
          }
          text[field] = string;
          return true;
      }
    }

    private int fieldName() {
      String name = string();
      if (name == null) {
        return UNKNOWN;
      }
      switch (name) {
        case "event_id":
          return EVENT_ID;
        case "store_id":
          return STORE_ID;
        case "sku":
          return SKU;
        case "kind":
          return KIND;
        case "quantity":
          return QUANTITY;
        case "unit_price":
          return UNIT_PRICE;
        case "ts":
          return TS;
        default:
          return UNKNOWN;
      }
    }

    /** A string of printable ASCII other than the quote and the backslash. */
    private String string() {
      if (!take('"')) {
        return null;
      }
      int start = at;
      while (at < in.length) {
        byte b = in[at];
        if (b == '"') {
          String s = new String(in, start, at - start, StandardCharsets.US_ASCII);
          at++;
          return s;
        }
        if (b < 0x20 || b > 0x7e || b == '\\') {
          return null;
        }
        at++;
      }
      return null;
    }

    /** -?(0|[1-9][0-9]{0,17}), not followed by a fraction or an exponent. */
    private Long integer() {
      int start = at;
      take('-');
      int digits = digits();
      if (digits == 0 || digits > 18 || (digits > 1 && in[at - digits] == '0')) {
        return null;
      }
      if (at < in.length && (in[at] == '.' || in[at] == 'e' || in[at] == 'E')) {
        return null;
      }
      return Long.parseLong(new String(in, start, at - start, StandardCharsets.US_ASCII));
    }

    /** null, or a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
    private boolean price() {
      if (at + 4 <= in.length && in[at] == 'n' && in[at + 1] == 'u' && in[at + 2] == 'l'
          && in[at + 3] == 'l') {
        at += 4;
        unitPrice = null;
        return true;
      }
      int start = at;
      take('-');
      int digits = digits();
      if (digits == 0 || (digits > 1 && in[at - digits] == '0')) {
        return false;
      }
      if (take('.') && digits() == 0) {
        return false;
      }
      if (take('e') || take('E')) {
        if (!take('+')) {
          take('-');
        }
        if (digits() == 0) {
          return false;
        }
      }
      unitPrice = Double.parseDouble(
          new String(in, start, at - start, StandardCharsets.US_ASCII));
      return true;
    }

    private Row verdict(byte[] key) {
      String eventId = text[EVENT_ID], storeId = text[STORE_ID], sku = text[SKU];
      String kind = text[KIND];
      boolean ok = textOk(eventId) && textOk(storeId) && textOk(sku) && kind != null
          && hasQuantity && hasTs
          && (kind.equals("sale") || kind.equals("restock") || kind.equals("adjust"))
          && quantity >= -QUANTITY_LIMIT && quantity <= QUANTITY_LIMIT
          && ts >= 0 && ts <= TS_MAX
          && (unitPrice == null || (unitPrice >= 0.0 && unitPrice <= PRICE_MAX))
          && (kind.equals("adjust") ? quantity != 0 : quantity > 0)
          && (!kind.equals("sale") || unitPrice != null)
          && key != null
          && Arrays.equals(key, storeId.getBytes(StandardCharsets.US_ASCII));
      if (!ok) {
        return INVALID;
      }
      return RowFactory.create(true, eventId, storeId, sku, kind, quantity, unitPrice, ts);
    }

    private static boolean textOk(String s) {
      return s != null && !s.isEmpty() && s.length() <= TEXT_MAX;
    }

    private int digits() {
      int start = at;
      while (at < in.length && in[at] >= '0' && in[at] <= '9') {
        at++;
      }
      return at - start;
    }

    private boolean take(char c) {
      if (at < in.length && in[at] == c) {
        at++;
        return true;
      }
      return false;
    }

    private void skipSpace() {
      while (at < in.length && (in[at] == ' ' || in[at] == '\t' || in[at] == '\n' || in[at] == '\r')) {
        at++;
      }
    }

    private boolean end() {
      skipSpace();
      return at == in.length;
    }
  }
}
