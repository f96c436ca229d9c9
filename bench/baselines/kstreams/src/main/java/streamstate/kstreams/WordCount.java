package streamstate.kstreams;

import java.util.List;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The word count: {@code text-lines} split into the contract's tokens, grouped by word (one
 * repartition record per word) and counted into a persistent RocksDB store with its changelog.
 * A line that is not UTF-8 or is too large goes to the dead-letter topic.
 */
public final class WordCount {
  public static final String NAME = "wordcount";
  public static final String STORE = "word-counts";
  /** The repartition topic is {@code <application id>-words-repartition}. */
  public static final String REPARTITION = "words";

  private WordCount() {}

  static List<String> tokens(byte[] key, byte[] line) throws InvalidEvent {
    Records.text(line, ItemEvent.MAX_BYTES);
    return Tokens.of(line);
  }

  public static Topology build(Names names) {
    StreamsBuilder builder = new StreamsBuilder();
    KStream<byte[], Checked<List<String>>> lines =
        builder.stream(Names.TEXT_LINES, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
            .processValues(
                () -> new Checked.Validate<>(WordCount::tokens), Named.as("tokenize"));
    lines
        .filter((key, line) -> !line.valid(), Named.as("invalid-lines"))
        .mapValues(line -> line.raw)
        .to(names.dlq(Names.TEXT_LINES), Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
    lines
        .filter((key, line) -> line.valid(), Named.as("valid-lines"))
        .flatMapValues(line -> line.value)
        .groupBy((key, word) -> word, Grouped.with(REPARTITION, Serdes.String(), Serdes.String()))
        .count(
            Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as(STORE)
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long()));
    return builder.build();
  }
}
