package streamstate.kstreams;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.VersionedKeyValueStore;
import org.apache.kafka.streams.state.VersionedRecord;

/**
 * The product catalogue as a global versioned store: each sku's category by the timestamp of
 * its {@code products} record, so a sale is enriched with the category as of its own {@code ts}
 * (the project's rule, {@code tables/catalog.py}). Invalid product records are skipped; a
 * tombstone deletes the product from its timestamp on.
 */
public final class Products {
  public static final String STORE = "products";
  /** How far back versions are kept, relative to the newest product record. */
  static final Duration HISTORY = Duration.ofDays(365);
  /** The category of a sale whose sku has no version at its time. */
  public static final String UNKNOWN = "unknown";

  private Products() {}

  public static StoreBuilder<VersionedKeyValueStore<String, String>> store() {
    return Stores.versionedKeyValueStoreBuilder(
            Stores.persistentVersionedKeyValueStore(STORE, HISTORY),
            Serdes.String(),
            Serdes.String())
        .withLoggingDisabled();
  }

  /** The category of a valid product record, or InvalidEvent. */
  static String category(byte[] key, byte[] value) throws InvalidEvent {
    JsonNode root = Fields.object(Json.tree(Records.text(value, ItemEvent.MAX_BYTES)));
    String sku = Fields.text(root, "sku", 256);
    JsonNode name = root.get("name");
    if (name == null || !name.isTextual()) {
      throw new InvalidEvent("name: input should be a valid string");
    }
    if (name.textValue().codePointCount(0, name.textValue().length()) > 1024) {
      throw new InvalidEvent("name: at most 1024 characters");
    }
    String category = Fields.text(root, "category", 256);
    Records.checkKey(key, sku, "sku");
    return category;
  }

  /** Keeps the global store: one version per valid product record. */
  public static final class Keep implements Processor<byte[], byte[], Void, Void> {
    private VersionedKeyValueStore<String, String> store;

    @Override
    public void init(ProcessorContext<Void, Void> context) {
      store = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
      if (record.key() == null) {
        return;
      }
      String sku = new String(record.key(), StandardCharsets.UTF_8);
      if (record.value() == null) {
        store.delete(sku, record.timestamp());
        return;
      }
      try {
        store.put(sku, category(record.key(), record.value()), record.timestamp());
      } catch (InvalidEvent invalid) {
        // The project dead-letters it once, from its own products pipeline; here it is skipped.
      }
    }
  }

  /** A sale, enriched with its category as of its ts and stamped with that ts. */
  public static final class Enrich implements FixedKeyProcessor<byte[], ItemEvent, Sale> {
    private FixedKeyProcessorContext<byte[], Sale> context;
    private VersionedKeyValueStore<String, String> store;

    @Override
    public void init(FixedKeyProcessorContext<byte[], Sale> context) {
      this.context = context;
      store = context.getStateStore(STORE);
    }

    @Override
    public void process(FixedKeyRecord<byte[], ItemEvent> record) {
      ItemEvent sale = record.value();
      VersionedRecord<String> version = store.get(sale.sku, sale.ts);
      String category = version == null ? UNKNOWN : version.value();
      context.forward(
          record
              .withValue(new Sale(category, sale.quantity, sale.revenue()))
              .withTimestamp(sale.ts));
    }
  }
}
