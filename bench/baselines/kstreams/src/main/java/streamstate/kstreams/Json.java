package streamstate.kstreams;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;

/** Jackson, set up to read the wire records as strictly as the project's validation does. */
public final class Json {
  public static final ObjectMapper MAPPER =
      new ObjectMapper().enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS);

  private Json() {}

  /** The JSON tree of a UTF-8 text, or InvalidEvent naming the syntax error. */
  public static JsonNode tree(String text) throws InvalidEvent {
    try {
      return MAPPER.readTree(text);
    } catch (JsonProcessingException error) {
      throw new InvalidEvent("value: invalid JSON (" + error.getOriginalMessage() + ")");
    }
  }

  /** A serde that writes {@code type} as JSON with Jackson. */
  public static <T> Serde<T> serde(Class<T> type) {
    Serializer<T> serializer =
        (topic, value) -> {
          if (value == null) {
            return null;
          }
          try {
            return MAPPER.writeValueAsBytes(value);
          } catch (JsonProcessingException error) {
            throw new IllegalStateException(error);
          }
        };
    Deserializer<T> deserializer =
        (topic, bytes) -> {
          if (bytes == null) {
            return null;
          }
          try {
            return MAPPER.readValue(bytes, type);
          } catch (IOException error) {
            throw new UncheckedIOException(error);
          }
        };
    return Serdes.serdeFrom(serializer, deserializer);
  }
}
