package streamstate.kstreams;

import com.fasterxml.jackson.databind.JsonNode;
import java.math.BigInteger;

/** Checks of single JSON fields, with the project's wire rules (pydantic, strict mode). */
final class Fields {
  /** The largest epoch milliseconds accepted (the end of year 9999). */
  static final long MAX_EPOCH_MS = 253_402_300_799_999L;

  private Fields() {}

  static JsonNode object(JsonNode root) throws InvalidEvent {
    if (root == null || !root.isObject()) {
      throw new InvalidEvent("value: not a JSON object");
    }
    return root;
  }

  /** A string of 1 to {@code max} characters. */
  static String text(JsonNode root, String name, int max) throws InvalidEvent {
    JsonNode node = root.get(name);
    if (node == null) {
      throw new InvalidEvent(name + ": field required");
    }
    if (!node.isTextual()) {
      throw new InvalidEvent(name + ": input should be a valid string");
    }
    String value = node.textValue();
    int length = value.codePointCount(0, value.length());
    if (length < 1 || length > max) {
      throw new InvalidEvent(name + ": length must be 1 to " + max + " characters");
    }
    return value;
  }

  /** A JSON integer (not a float, not a boolean) in {@code [min, max]}. */
  static long integer(JsonNode root, String name, long min, long max) throws InvalidEvent {
    JsonNode node = root.get(name);
    if (node == null) {
      throw new InvalidEvent(name + ": field required");
    }
    if (!node.isIntegralNumber()) {
      throw new InvalidEvent(name + ": input should be a valid integer");
    }
    BigInteger value = node.bigIntegerValue();
    if (value.compareTo(BigInteger.valueOf(min)) < 0
        || value.compareTo(BigInteger.valueOf(max)) > 0) {
      throw new InvalidEvent(name + ": must be in [" + min + ", " + max + "]");
    }
    return value.longValue();
  }

  /** A finite JSON number in {@code [min, max]}; null when absent or null and optional. */
  static Double number(JsonNode root, String name, double min, double max, boolean optional)
      throws InvalidEvent {
    JsonNode node = root.get(name);
    if (node == null || node.isNull()) {
      if (optional) {
        return null;
      }
      throw new InvalidEvent(name + ": field required");
    }
    if (!node.isNumber()) {
      throw new InvalidEvent(name + ": input should be a valid number");
    }
    double value = node.doubleValue();
    if (!Double.isFinite(value)) {
      throw new InvalidEvent(name + ": input should be a finite number");
    }
    if (value < min || value > max) {
      throw new InvalidEvent(name + ": must be in [" + min + ", " + max + "]");
    }
    return value;
  }
}
