package streamstate.jobs;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * The pieces of a parser of records in a plain JSON form: a flat object whose values are
 * strings without escapes, numbers or literals. A method that finds something else says so,
 * and the caller leaves the record to the stream's own Python validation.
 */
abstract class PlainJson {
  /** Verdicts of a parse. */
  static final int VALID = 0, INVALID = 1, NOT_PLAIN = 2;
  /** What {@link #fieldName} gives for a name not in its list, and for no plain name. */
  static final int UNKNOWN = -1, NOT_A_NAME = -2;

  protected byte[] in;
  protected int at;
  /** The value of the last {@link #integer} or {@link #decimal}. */
  protected long number;
  protected double decimal;

  protected void reset(byte[] value) {
    in = value;
    at = 0;
  }

  static byte[][] names(String... names) {
    byte[][] out = new byte[names.length][];
    for (int i = 0; i < names.length; i++) {
      out[i] = names[i].getBytes(StandardCharsets.US_ASCII);
    }
    return out;
  }

  /** The index in {@code names} of the member name at hand, UNKNOWN, or NOT_A_NAME. */
  protected int fieldName(byte[][] names) {
    if (!take('"')) {
      return NOT_A_NAME;
    }
    int start = at;
    while (at < in.length && in[at] != '"') {
      byte b = in[at];
      if (b < 0x20 || b > 0x7e || b == '\\') {
        return NOT_A_NAME;
      }
      at++;
    }
    if (at == in.length) {
      return NOT_A_NAME;
    }
    int length = at - start;
    at++;
    for (int field = 0; field < names.length; field++) {
      byte[] name = names[field];
      if (name.length == length && Arrays.equals(in, start, start + length, name, 0, length)) {
        return field;
      }
    }
    return UNKNOWN;
  }

  /**
   * The end of a string without escapes or control characters that starts here (its closing
   * quote), or -1. With {@code ascii} it must be printable ASCII; otherwise any other byte is
   * allowed (the caller has checked that the whole record is UTF-8).
   */
  protected int stringEnd(boolean ascii) {
    if (!take('"')) {
      return -1;
    }
    while (at < in.length) {
      byte b = in[at];
      if (b == '"') {
        return at++;
      }
      if ((b >= 0 && b < 0x20) || b == '\\' || (ascii && (b < 0 || b > 0x7e))) {
        return -1;
      }
      at++;
    }
    return -1;
  }

  /** -?(0|[1-9][0-9]{0,17}), not followed by a fraction or an exponent, into number. */
  protected boolean integer() {
    boolean negative = take('-');
    int start = at;
    int digits = digits();
    if (digits == 0 || digits > 18 || (digits > 1 && in[start] == '0')) {
      return false;
    }
    if (at < in.length && (in[at] == '.' || in[at] == 'e' || in[at] == 'E')) {
      return false;
    }
    long value = 0;
    for (int i = start; i < at; i++) {
      value = value * 10 + (in[i] - '0');
    }
    number = negative ? -value : value;
    return true;
  }

  /** A JSON number, -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, into decimal. */
  protected boolean decimal() {
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
    decimal = Double.parseDouble(new String(in, start, at - start, StandardCharsets.ISO_8859_1));
    return true;
  }

  protected boolean literal(String word) {
    int length = word.length();
    if (at + length > in.length) {
      return false;
    }
    for (int i = 0; i < length; i++) {
      if (in[at + i] != word.charAt(i)) {
        return false;
      }
    }
    at += length;
    return true;
  }

  protected int digits() {
    int start = at;
    while (at < in.length && in[at] >= '0' && in[at] <= '9') {
      at++;
    }
    return at - start;
  }

  protected boolean take(char c) {
    if (at < in.length && in[at] == c) {
      at++;
      return true;
    }
    return false;
  }

  protected void skipSpace() {
    while (at < in.length
        && (in[at] == ' ' || in[at] == '\t' || in[at] == '\n' || in[at] == '\r')) {
      at++;
    }
  }

  protected boolean end() {
    skipSpace();
    return at == in.length;
  }

  /** Whether the object's members all parse with {@link #member}, and nothing follows it. */
  protected int object() {
    skipSpace();
    if (!take('{')) {
      return NOT_PLAIN;
    }
    skipSpace();
    if (take('}')) {
      return end() ? INVALID : NOT_PLAIN; // {} lacks every required field
    }
    do {
      skipSpace();
      if (!member()) {
        return NOT_PLAIN;
      }
      skipSpace();
    } while (take(','));
    if (!take('}') || !end()) {
      return NOT_PLAIN;
    }
    return VALID;
  }

  /** One member, name and value; false when it is not in the plain form. */
  protected abstract boolean member();
}
