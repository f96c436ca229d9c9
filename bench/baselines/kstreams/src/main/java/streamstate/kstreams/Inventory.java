package streamstate.kstreams;

import java.time.Duration;
import org.apache.kafka.common.serialization.Serde;
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
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The inventory pipeline: {@code item-events} validated (invalid ones to the dead-letter
 * topic) into
 *
 * <ul>
 *   <li>{@code inventory}: stock per store, a Jackson JSON value like the project's table;
 *   <li>{@code sales-by-category}: each sale enriched with its product's category as of its ts
 *       (the global versioned {@code products} store), re-keyed by category (one repartition
 *       record per sale) and summed in 1-hour tumbling windows on ts;
 *   <li>settling: sales joined with {@code payments} ({@link Settle}), settled pairs to a topic,
 *       unsettled sales counted per store.
 * </ul>
 */
public final class Inventory {
  public static final String NAME = "inventory";
  public static final String STOCK = "inventory";
  public static final String SALES = "sales-by-category";
  /** The repartition topic is {@code <application id>-sales-repartition}. */
  public static final String REPARTITION = "sales";
  /**
   * Late sales are still added this long after their window (event time): the project keeps
   * windows for STREAMSTATE_WINDOW_RETENTION_DAYS (7 days by default) and adds every sale
   * until then.
   */
  static final Duration GRACE = Duration.ofDays(7);

  private Inventory() {}

  public static Topology build(Names names) {
    StreamsBuilder builder = new StreamsBuilder();
    builder.addGlobalStore(
        Products.store(),
        Names.PRODUCTS,
        Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()),
        Products.Keep::new);
    for (StoreBuilder<?> store : Settle.stores()) {
      builder.addStateStore(store);
    }
    KStream<byte[], ItemEvent> events =
        valid(builder, Names.ITEM_EVENTS, ItemEvent::parse, names).mapValues(c -> c.value);
    KStream<byte[], Payment> payments =
        valid(builder, Names.PAYMENTS, Payment::parse, names).mapValues(c -> c.value);

    Serde<Stock> stock = Json.serde(Stock.class);
    events
        .groupByKey(Grouped.keySerde(Serdes.ByteArray()))
        .aggregate(
            Stock::new,
            (store, event, state) -> state.apply(event),
            Materialized.<byte[], Stock, KeyValueStore<Bytes, byte[]>>as(STOCK)
                .withKeySerde(Serdes.ByteArray())
                .withValueSerde(stock));

    events
        .filter((store, event) -> event.isSale(), Named.as("sales"))
        .processValues(Products.Enrich::new, Named.as("enrich"))
        .selectKey((store, sale) -> sale.category)
        .groupByKey(Grouped.with(REPARTITION, Serdes.String(), Json.serde(Sale.class)))
        .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofHours(1), GRACE))
        .aggregate(
            SalesTotal::new,
            (category, sale, total) -> total.add(sale),
            Materialized.<String, SalesTotal, WindowStore<Bytes, byte[]>>as(SALES)
                .withKeySerde(Serdes.String())
                .withValueSerde(Json.serde(SalesTotal.class))
                .withRetention(Duration.ofHours(1).plus(GRACE)));

    events
        .mapValues(JoinInput::of)
        .merge(payments.mapValues(JoinInput::of))
        .process(
            Settle::new,
            Named.as("settle"),
            Settle.SALES,
            Settle.PAYMENTS,
            Settle.WATERMARKS,
            Settle.UNSETTLED)
        .to(names.settledSales(), Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
    return builder.build();
  }

  /** The valid records of a source topic; the invalid ones go to its dead-letter topic. */
  private static <T> KStream<byte[], Checked<T>> valid(
      StreamsBuilder builder, String topic, Checked.Parser<T> parser, Names names) {
    KStream<byte[], Checked<T>> checked =
        builder.stream(topic, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
            .processValues(() -> new Checked.Validate<>(parser), Named.as("validate-" + topic));
    checked
        .filter((key, record) -> !record.valid(), Named.as("invalid-" + topic))
        .mapValues(record -> record.raw)
        .to(names.dlq(topic), Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
    return checked.filter((key, record) -> record.valid(), Named.as("valid-" + topic));
  }
}
