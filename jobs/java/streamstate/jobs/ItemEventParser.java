package streamstate.jobs;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * Parses and validates an item event in the plain form ({@link PlainItemEvent} says what that
 * is). One instance parses many records in turn; after {@link #parse} the fields of a
 * {@link #VALID} event are in its fields.
 */
final class ItemEventParser extends PlainJson {
  static final int TEXT_MAX = 256;
  static final long QUANTITY_LIMIT = 1_000_000L;
  static final double PRICE_MAX = 1e9;
  static final long TS_MAX = 253_402_300_799_999L;

  /** Field numbers: the first four are strings. */
  private static final int EVENT_ID = 0, STORE_ID = 1, SKU = 2, KIND = 3;
  private static final int QUANTITY = 4, UNIT_PRICE = 5, TS = 6;
  private static final byte[][] NAMES =
      names("event_id", "store_id", "sku", "kind", "quantity", "unit_price", "ts");

  /** The event's fields, once {@link #parse} returned {@link #VALID}. */
  String eventId, storeId, sku, kind;
  long quantity, ts;
  Double unitPrice;

  private final String[] text = new String[4];
  private boolean hasQuantity, hasTs;

  /** The verdict on one record of {@code item-events}. */
  int parse(byte[] key, byte[] value, int maxBytes) {
    if (value == null || value.length > maxBytes) {
      return INVALID; // both are rejected before any parsing in the stream too
    }
    reset(value);
    Arrays.fill(text, null);
    hasQuantity = false;
    hasTs = false;
    unitPrice = null;
    int verdict = object();
    return verdict == VALID ? verdict(key) : verdict;
  }

  @Override
  protected boolean member() {
    int field = fieldName(NAMES);
    if (field < 0) {
      return false; // another field: the stream's schema decides
    }
    skipSpace();
    if (!take(':')) {
      return false;
    }
    skipSpace();
    switch (field) {
      case QUANTITY:
        hasQuantity = integer();
        quantity = number;
        return hasQuantity;
      case TS:
        hasTs = integer();
        ts = number;
        return hasTs;
      case UNIT_PRICE:
        if (literal("null")) {
          unitPrice = null;
          return true;
        }
        if (!decimal()) {
          return false;
        }
        unitPrice = decimal;
        return true;
      default:
        int start = at + 1;
        int end = stringEnd(true);
        if (end < 0) {
          return false;
        }
        text[field] = new String(in, start, end - start, StandardCharsets.ISO_8859_1);
        return true;
    }
  }

  private int verdict(byte[] key) {
    eventId = text[EVENT_ID];
    storeId = text[STORE_ID];
    sku = text[SKU];
    kind = text[KIND];
    boolean ok = textOk(eventId) && textOk(storeId) && textOk(sku) && kind != null
        && hasQuantity && hasTs
        && (kind.equals("sale") || kind.equals("restock") || kind.equals("adjust"))
        && quantity >= -QUANTITY_LIMIT && quantity <= QUANTITY_LIMIT
        && ts >= 0 && ts <= TS_MAX
        && (unitPrice == null || (unitPrice >= 0.0 && unitPrice <= PRICE_MAX))
        && (kind.equals("adjust") ? quantity != 0 : quantity > 0)
        && (!kind.equals("sale") || unitPrice != null)
        && key != null
        && sameAscii(key, storeId);
    return ok ? VALID : INVALID;
  }

  static boolean sameAscii(byte[] key, String text) {
    if (key.length != text.length()) {
      return false;
    }
    for (int i = 0; i < key.length; i++) {
      if (key[i] != text.charAt(i)) {
        return false;
      }
    }
    return true;
  }

  private static boolean textOk(String s) {
    return s != null && !s.isEmpty() && s.length() <= TEXT_MAX;
  }
}
