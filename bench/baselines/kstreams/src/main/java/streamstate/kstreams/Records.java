package streamstate.kstreams;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Optional;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.streams.processor.api.RecordMetadata;

/** What every source record goes through: size, UTF-8, key, and the dead-letter headers. */
public final class Records {
  private Records() {}

  /** The value as text: present, at most {@code maxBytes}, valid UTF-8. */
  static String text(byte[] value, int maxBytes) throws InvalidEvent {
    if (value == null) {
      throw new InvalidEvent("value: missing (null record value)");
    }
    if (value.length > maxBytes) {
      throw new InvalidEvent(
          "value: " + value.length + " bytes exceeds the limit of " + maxBytes);
    }
    String text = Tokens.decode(value);
    if (text == null) {
      throw new InvalidEvent("value: not UTF-8");
    }
    return text;
  }

  /** A keyed topic's record key must be the bytes of the field it is partitioned by. */
  static void checkKey(byte[] key, String expected, String field) throws InvalidEvent {
    if (key == null) {
      throw new InvalidEvent("key: missing, expected the " + field + " '" + expected + "'");
    }
    if (!Arrays.equals(key, expected.getBytes(StandardCharsets.UTF_8))) {
      throw new InvalidEvent("key: does not match " + field + " '" + expected + "'");
    }
  }

  /** The contract's dead-letter headers: error, source-topic, -partition, -offset. */
  static void deadLetterHeaders(
      Headers headers, String reason, Optional<RecordMetadata> source) {
    headers.add("error", reason.getBytes(StandardCharsets.UTF_8));
    source.ifPresent(
        where -> {
          headers.add("source-topic", where.topic().getBytes(StandardCharsets.UTF_8));
          headers.add(
              "source-partition",
              Integer.toString(where.partition()).getBytes(StandardCharsets.UTF_8));
          headers.add(
              "source-offset", Long.toString(where.offset()).getBytes(StandardCharsets.UTF_8));
        });
  }
}
