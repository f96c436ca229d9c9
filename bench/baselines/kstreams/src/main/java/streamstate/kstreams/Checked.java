package streamstate.kstreams;

import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/** A source record after validation: its parsed value, or the reason it is invalid. */
public final class Checked<T> {
  /** Parses one record; throws InvalidEvent for a record that fails validation. */
  @FunctionalInterface
  public interface Parser<T> {
    T parse(byte[] key, byte[] value) throws InvalidEvent;
  }

  public final T value;
  public final byte[] raw;
  public final String error;

  private Checked(T value, byte[] raw, String error) {
    this.value = value;
    this.raw = raw;
    this.error = error;
  }

  public boolean valid() {
    return error == null;
  }

  /**
   * Validates each record with {@code parser}; an invalid one keeps its original bytes and
   * gets the contract's dead-letter headers.
   */
  public static final class Validate<T> implements FixedKeyProcessor<byte[], byte[], Checked<T>> {
    private final Parser<T> parser;
    private FixedKeyProcessorContext<byte[], Checked<T>> context;

    public Validate(Parser<T> parser) {
      this.parser = parser;
    }

    @Override
    public void init(FixedKeyProcessorContext<byte[], Checked<T>> context) {
      this.context = context;
    }

    @Override
    public void process(FixedKeyRecord<byte[], byte[]> record) {
      try {
        T value = parser.parse(record.key(), record.value());
        context.forward(record.withValue(new Checked<>(value, null, null)));
      } catch (InvalidEvent invalid) {
        RecordHeaders headers = new RecordHeaders();
        Records.deadLetterHeaders(headers, invalid.getMessage(), context.recordMetadata());
        context.forward(
            record
                .withValue(new Checked<T>(null, record.value(), invalid.getMessage()))
                .withHeaders(headers));
      }
    }
  }
}
