package streamstate.jobs;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF3;

/**
 * Parses and validates a catalogue record ({@code products}) in the plain form, in the JVM.
 *
 * <p>The plain form is a flat JSON object whose members {@code sku}, {@code name} and
 * {@code category} are strings without escapes or control characters (any other UTF-8 text
 * is allowed), and whose other members, which the schema ignores, are such strings,
 * integers of up to 18 digits, finite numbers, {@code true}, {@code false} or {@code null}.
 * A field given twice counts with its last value.
 *
 * <p>Returns null for a record outside the plain form: the caller hands those to the stream's
 * own Python validation. Otherwise a row {@code (ok, category)}: {@code ok} is the verdict of
 * {@code app/models.py} Product and the key check (the key is the SKU), restated here; a
 * tombstone (null value) with a key is a deletion, {@code (true, null)}.
 */
public final class PlainProduct implements UDF3<byte[], byte[], Integer, Row> {
  private static final long serialVersionUID = 1L;

  private static final Row INVALID = RowFactory.create(false, null);
  private static final Row DELETION = RowFactory.create(true, null);

  private transient Parser parser;

  @Override
  public Row call(byte[] key, byte[] value, Integer maxBytes) {
    if (key == null) {
      return INVALID;
    }
    if (value == null) {
      return DELETION;
    }
    if (parser == null) {
      parser = new Parser();
    }
    switch (parser.parse(key, value, maxBytes)) {
      case PlainJson.VALID:
        return RowFactory.create(true, parser.category);
      case PlainJson.INVALID:
        return INVALID;
      default:
        return null;
    }
  }

  /** One record after another. */
  static final class Parser extends PlainJson {
    static final int TEXT_MAX = 256, NAME_MAX = 1024;
    private static final int SKU = 0, NAME = 1, CATEGORY = 2;
    private static final byte[][] NAMES = names("sku", "name", "category");

    private final int[] start = new int[3], end = new int[3];
    private int[] points = new int[256];
    String category;

    int parse(byte[] key, byte[] value, int maxBytes) {
      if (value.length > maxBytes || !utf8(value)) {
        return INVALID; // both are rejected before any parsing in the stream too
      }
      reset(value);
      Arrays.fill(start, -1);
      int verdict = object();
      return verdict == VALID ? verdict(key) : verdict;
    }

    private boolean utf8(byte[] value) {
      for (byte b : value) {
        if (b < 0) {
          if (points.length < value.length) {
            points = new int[value.length];
          }
          return Utf8.decode(value, points) >= 0;
        }
      }
      return true;
    }

    @Override
    protected boolean member() {
      int field = fieldName(NAMES);
      if (field == NOT_A_NAME) {
        return false;
      }
      skipSpace();
      if (!take(':')) {
        return false;
      }
      skipSpace();
      if (field == UNKNOWN) {
        return ignoredValue();
      }
      int from = at + 1;
      int to = stringEnd(false);
      if (to < 0) {
        return false;
      }
      start[field] = from;
      end[field] = to;
      return true;
    }

    /** A value the schema ignores, if it is plain. */
    private boolean ignoredValue() {
      if (at < in.length && in[at] == '"') {
        return stringEnd(false) >= 0;
      }
      if (literal("null") || literal("true") || literal("false")) {
        return true;
      }
      int from = at;
      if (integer()) {
        return true;
      }
      at = from;
      return decimal() && Double.isFinite(decimal);
    }

    private int verdict(byte[] key) {
      if (!length(SKU, 1, TEXT_MAX) || !length(NAME, 0, NAME_MAX)
          || !length(CATEGORY, 1, TEXT_MAX)) {
        return INVALID;
      }
      int skuLength = end[SKU] - start[SKU];
      if (!Arrays.equals(key, 0, key.length, in, start[SKU], start[SKU] + skuLength)) {
        return INVALID;
      }
      category = new String(in, start[CATEGORY], end[CATEGORY] - start[CATEGORY],
          StandardCharsets.UTF_8);
      return VALID;
    }

    /** Whether the field is there with between min and max characters (code points). */
    private boolean length(int field, int min, int max) {
      if (start[field] < 0) {
        return false;
      }
      int characters = 0;
      for (int i = start[field]; i < end[field]; i++) {
        if ((in[i] & 0xC0) != 0x80) {
          characters++;
        }
      }
      return characters >= min && characters <= max;
    }
  }
}
