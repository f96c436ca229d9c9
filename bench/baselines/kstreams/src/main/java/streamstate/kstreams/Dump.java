package streamstate.kstreams;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.ReadOnlyWindowStore;

/**
 * Writes a running application's tables as one JSON document, shaped like the project's tables
 * so that the bench can compare them key by key: {@code word_counts} {word: count}, {@code
 * inventory} {store: value}, {@code sales_by_category} {"category@window start ms": value},
 * {@code unsettled_sales} {store: count}.
 */
public final class Dump {
  private Dump() {}

  public static void write(KafkaStreams streams, String topology, Path path) throws IOException {
    ObjectNode out = Json.MAPPER.createObjectNode();
    if (topology.equals(WordCount.NAME)) {
      ObjectNode counts = out.putObject("word_counts");
      ReadOnlyKeyValueStore<String, Long> store = keyValues(streams, WordCount.STORE);
      try (KeyValueIterator<String, Long> all = store.all()) {
        all.forEachRemaining(kv -> counts.put(kv.key, kv.value));
      }
    } else {
      ObjectNode stock = out.putObject("inventory");
      ReadOnlyKeyValueStore<byte[], Stock> stores = keyValues(streams, Inventory.STOCK);
      try (KeyValueIterator<byte[], Stock> all = stores.all()) {
        all.forEachRemaining(
            kv ->
                stock.set(
                    new String(kv.key, StandardCharsets.UTF_8), Json.MAPPER.valueToTree(kv.value)));
      }
      ObjectNode sales = out.putObject("sales_by_category");
      ReadOnlyWindowStore<String, SalesTotal> windows =
          streams.store(
              StoreQueryParameters.fromNameAndType(
                  Inventory.SALES, QueryableStoreTypes.<String, SalesTotal>windowStore()));
      try (KeyValueIterator<Windowed<String>, SalesTotal> all = windows.all()) {
        while (all.hasNext()) {
          KeyValue<Windowed<String>, SalesTotal> kv = all.next();
          String key = kv.key.key() + "@" + kv.key.window().start();
          sales.set(key, Json.MAPPER.valueToTree(kv.value));
        }
      }
      ObjectNode unsettled = out.putObject("unsettled_sales");
      ReadOnlyKeyValueStore<String, Long> counts = keyValues(streams, Settle.UNSETTLED);
      try (KeyValueIterator<String, Long> all = counts.all()) {
        all.forEachRemaining(kv -> unsettled.put(kv.key, kv.value));
      }
    }
    Path partial = path.resolveSibling(path.getFileName() + ".partial");
    Files.write(partial, Json.MAPPER.writeValueAsBytes(out));
    Files.move(partial, path, StandardCopyOption.ATOMIC_MOVE);
  }

  private static <K, V> ReadOnlyKeyValueStore<K, V> keyValues(KafkaStreams streams, String name) {
    return streams.store(
        StoreQueryParameters.fromNameAndType(name, QueryableStoreTypes.<K, V>keyValueStore()));
  }
}
