package streamstate.kstreams;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;

/**
 * Settling, the contract's join of sales and payments, with the Processor API: the DSL's
 * windowed left join decides on each side's stream time as the two topics interleave, while
 * the contract's result must not depend on the interleaving.
 *
 * <p>A payment settles the sale whose event_id is its sale_event_id when its ts lies in {@code
 * [sale.ts, sale.ts + 10 min]}. Event time is kept per side and partition (the largest ts
 * seen). Each buffered record remembers its own side's event time when it arrived, and a pair
 * matches only if neither record came after its side had passed the other's window by more
 * than that side's grace (sales: 10 min, payments: none). A sale that nothing settled counts
 * in {@code unsettled-sales} once event time on both sides has passed {@code sale.ts + 10
 * min}; payments are dropped once sales' event time is 10 minutes past them. Settled pairs go
 * to the settled-sales topic as {"sale": ..., "payment": ...}.
 *
 * <p>Each side's buffer holds, under its join key, the records of that key (read with one
 * point lookup, never a scan, which would step over the deletion markers of expired keys),
 * and a time index for expiry.
 */
public final class Settle implements Processor<byte[], JoinInput, byte[], byte[]> {
  public static final String SALES = "settling-sales";
  public static final String PAYMENTS = "settling-payments";
  public static final String WATERMARKS = "settling-watermarks";
  public static final String UNSETTLED = "unsettled-sales";
  static final long WINDOW_MS = 10 * 60 * 1000;
  static final long SALES_GRACE_MS = WINDOW_MS;
  static final long PAYMENTS_GRACE_MS = 0;

  private static final byte RECORD = 'k';
  private static final byte BY_TIME = 't';
  /** A source record's position: partition (4 bytes), offset (8). */
  private static final int SEQ_BYTES = 12;
  private static final long NONE = Long.MIN_VALUE;
  /** The earliest ts of an empty buffer. */
  private static final long EMPTY = Long.MAX_VALUE;

  private ProcessorContext<byte[], byte[]> context;
  private final Side sales = new Side(true);
  private final Side payments = new Side(false);
  private KeyValueStore<String, Long> watermarks;
  private KeyValueStore<String, Long> unsettled;

  /**
   * The join's stores, persistent with changelogs. The buffers, scanned by range, keep Kafka
   * Streams' default for a store builder (no cache: a range over a cached store copies the
   * cached keys of the range); the event times and the counts, a few keys written by nearly
   * every record, are cached like the DSL's stores.
   */
  public static List<StoreBuilder<?>> stores() {
    List<StoreBuilder<?>> out = new ArrayList<>();
    for (String name : List.of(SALES, PAYMENTS)) {
      out.add(
          Stores.keyValueStoreBuilder(
              Stores.persistentKeyValueStore(name), Serdes.Bytes(), Serdes.ByteArray()));
    }
    for (String name : List.of(WATERMARKS, UNSETTLED)) {
      out.add(
          Stores.keyValueStoreBuilder(
                  Stores.persistentKeyValueStore(name), Serdes.String(), Serdes.Long())
              .withCachingEnabled());
    }
    return out;
  }

  /** One side's buffer, its event time, and the earliest ts it may hold. */
  private final class Side {
    final boolean left;
    KeyValueStore<Bytes, byte[]> store;
    long eventTime = NONE;
    /** The smallest buffered ts (a lower bound), EMPTY, or NONE when not known. */
    long earliest = NONE;
    /**
     * Every time key below this ts is deleted: scans start here, not at the deletion markers
     * that RocksDB keeps until a compaction, which a seek would otherwise step over each time.
     */
    long floor = 0;

    Side(boolean left) {
      this.left = left;
    }

    String name() {
      return left ? "left" : "right";
    }
  }

  /** A buffered record: its ts, its side's event time when it came, match flag, its value. */
  static final class Buffered {
    final long ts;
    final long watermark;
    final boolean matched;
    final String storeId;
    final String json;

    Buffered(long ts, long watermark, boolean matched, String storeId, String json) {
      this.ts = ts;
      this.watermark = watermark;
      this.matched = matched;
      this.storeId = storeId;
      this.json = json;
    }

    byte[] encode() {
      byte[] store = storeId.getBytes(StandardCharsets.UTF_8);
      byte[] value = json.getBytes(StandardCharsets.UTF_8);
      return ByteBuffer.allocate(8 + 8 + 1 + 4 + store.length + value.length)
          .putLong(ts)
          .putLong(watermark)
          .put((byte) (matched ? 1 : 0))
          .putInt(store.length)
          .put(store)
          .put(value)
          .array();
    }

    static Buffered decode(byte[] raw) {
      ByteBuffer in = ByteBuffer.wrap(raw);
      long ts = in.getLong();
      long watermark = in.getLong();
      boolean matched = in.get() == 1;
      int storeLength = in.getInt();
      String storeId = new String(raw, in.position(), storeLength, StandardCharsets.UTF_8);
      int at = in.position() + storeLength;
      String json = new String(raw, at, raw.length - at, StandardCharsets.UTF_8);
      return new Buffered(ts, watermark, matched, storeId, json);
    }

    Buffered matched() {
      return new Buffered(ts, watermark, true, storeId, json);
    }
  }

  @Override
  public void init(ProcessorContext<byte[], byte[]> context) {
    this.context = context;
    sales.store = context.getStateStore(SALES);
    payments.store = context.getStateStore(PAYMENTS);
    watermarks = context.getStateStore(WATERMARKS);
    unsettled = context.getStateStore(UNSETTLED);
    for (Side side : List.of(sales, payments)) {
      Long known = watermarks.get(side.name());
      side.eventTime = known == null ? NONE : known;
    }
  }

  @Override
  public void process(Record<byte[], JoinInput> record) {
    JoinInput in = record.value();
    Side own = in.left ? sales : payments;
    Side other = in.left ? payments : sales;
    if (own.eventTime == NONE || own.eventTime < in.ts) {
      own.eventTime = in.ts;
      watermarks.put(own.name(), in.ts);
    }
    if (in.joinKey != null) {
      RecordMetadata source = context.recordMetadata().orElseThrow();
      byte[] seq =
          ByteBuffer.allocate(12).putInt(source.partition()).putLong(source.offset()).array();
      byte[] joinKey = in.joinKey.getBytes(StandardCharsets.UTF_8);
      Buffered arrived = new Buffered(in.ts, own.eventTime, false, in.storeId, in.json);
      arrived = match(in.left, joinKey, arrived, other);
      admit(own, joinKey, seq, arrived);
    }
    expire(sales);
    expire(payments);
  }

  /** Emits every pair the arrived record forms with the other side's buffer. */
  private Buffered match(boolean left, byte[] joinKey, Buffered arrived, Side other) {
    Bytes key = Bytes.wrap(recordPrefix(joinKey));
    byte[] raw = other.store.get(key);
    if (raw == null) {
      return arrived;
    }
    Map<Bytes, Buffered> partners = bucket(raw);
    boolean changed = false;
    for (Map.Entry<Bytes, Buffered> partner : partners.entrySet()) {
      Buffered buffered = partner.getValue();
      Buffered sale = left ? arrived : buffered;
      Buffered payment = left ? buffered : arrived;
      if (!matches(sale, payment)) {
        continue;
      }
      emit(sale, payment);
      if (left) {
        arrived = arrived.matched();
      } else if (!buffered.matched) {
        partner.setValue(buffered.matched());
        changed = true;
      }
    }
    if (changed) {
      other.store.put(key, encode(partners));
    }
    return arrived;
  }

  /** The buffered records of one join key, by the position of their source record. */
  static Map<Bytes, Buffered> bucket(byte[] raw) {
    Map<Bytes, Buffered> out = new LinkedHashMap<>();
    if (raw == null) {
      return out;
    }
    ByteBuffer in = ByteBuffer.wrap(raw);
    for (int n = in.getInt(); n > 0; n--) {
      byte[] seq = new byte[SEQ_BYTES];
      in.get(seq);
      byte[] entry = new byte[in.getInt()];
      in.get(entry);
      out.put(Bytes.wrap(seq), Buffered.decode(entry));
    }
    return out;
  }

  static byte[] encode(Map<Bytes, Buffered> bucket) {
    List<byte[]> entries = new ArrayList<>();
    int size = 4;
    for (Buffered record : bucket.values()) {
      byte[] entry = record.encode();
      entries.add(entry);
      size += SEQ_BYTES + 4 + entry.length;
    }
    ByteBuffer out = ByteBuffer.allocate(size).putInt(bucket.size());
    int i = 0;
    for (Bytes seq : bucket.keySet()) {
      byte[] entry = entries.get(i++);
      out.put(seq.get()).putInt(entry.length).put(entry);
    }
    return out.array();
  }

  static boolean matches(Buffered sale, Buffered payment) {
    return sale.ts <= payment.ts
        && payment.ts <= sale.ts + WINDOW_MS
        && !saleClosed(sale.ts, payment.watermark)
        && !paymentClosed(payment.ts, sale.watermark);
  }

  /** Whether payments' event time rules out any further payment for a sale. */
  static boolean saleClosed(long saleTs, long paymentsTime) {
    return paymentsTime != NONE && paymentsTime - PAYMENTS_GRACE_MS > saleTs + WINDOW_MS;
  }

  /** Whether sales' event time rules out any further sale for a payment. */
  static boolean paymentClosed(long paymentTs, long salesTime) {
    return salesTime != NONE && salesTime - SALES_GRACE_MS > paymentTs;
  }

  private boolean expired(Side side, long ts) {
    if (!side.left) {
      return paymentClosed(ts, sales.eventTime);
    }
    return saleClosed(ts, payments.eventTime)
        && sales.eventTime != NONE
        && sales.eventTime > ts + WINDOW_MS;
  }

  private void admit(Side side, byte[] joinKey, byte[] seq, Buffered record) {
    if (expired(side, record.ts)) {
      // Past its window on both sides already: decided now, never buffered.
      if (side.left && !record.matched) {
        countUnsettled(record.storeId);
      }
      return;
    }
    Bytes key = Bytes.wrap(recordPrefix(joinKey));
    Map<Bytes, Buffered> bucket = bucket(side.store.get(key));
    if (bucket.putIfAbsent(Bytes.wrap(seq), record) != null) {
      return; // processed before (the record was read again after a failure)
    }
    side.store.put(key, encode(bucket));
    side.store.put(Bytes.wrap(timeKey(record.ts, seq)), key.get());
    if (side.earliest != NONE) {
      side.earliest = Math.min(side.earliest, record.ts);
    }
  }

  /**
   * The ts below which a side's records are expired: the records whose ts is smaller than the
   * returned value, and only those, satisfy {@link #expired}.
   */
  private long expiredBelow(Side side) {
    if (side.left) {
      if (payments.eventTime == NONE || sales.eventTime == NONE) {
        return Long.MIN_VALUE;
      }
      long time = Math.min(payments.eventTime - PAYMENTS_GRACE_MS, sales.eventTime);
      return time - WINDOW_MS;
    }
    return sales.eventTime == NONE ? Long.MIN_VALUE : sales.eventTime - SALES_GRACE_MS;
  }

  /** Drops what no partner can still match; unmatched sales among them count as unsettled. */
  private void expire(Side side) {
    long below = expiredBelow(side);
    boolean none = side.earliest == EMPTY || below <= 0;
    if (none || (side.earliest != NONE && side.earliest >= below)) {
      return;
    }
    List<KeyValue<Bytes, byte[]>> done = new ArrayList<>();
    Bytes from = Bytes.wrap(timeKey(side.floor, new byte[0]));
    Bytes to = Bytes.wrap(timeKey(below, new byte[0]));
    try (KeyValueIterator<Bytes, byte[]> byTime = side.store.range(from, to)) {
      byTime.forEachRemaining(done::add);
    }
    Map<Bytes, Map<Bytes, Buffered>> touched = new HashMap<>();
    for (KeyValue<Bytes, byte[]> entry : done) {
      Map<Bytes, Buffered> bucket =
          touched.computeIfAbsent(Bytes.wrap(entry.value), key -> bucket(side.store.get(key)));
      byte[] timeKey = entry.key.get();
      Buffered gone = bucket.remove(Bytes.wrap(Arrays.copyOfRange(timeKey, 9, timeKey.length)));
      if (gone != null && side.left && !gone.matched) {
        countUnsettled(gone.storeId);
      }
      side.store.delete(entry.key);
    }
    for (Map.Entry<Bytes, Map<Bytes, Buffered>> bucket : touched.entrySet()) {
      if (bucket.getValue().isEmpty()) {
        side.store.delete(bucket.getKey());
      } else {
        side.store.put(bucket.getKey(), encode(bucket.getValue()));
      }
    }
    side.floor = Math.max(side.floor, below);
    Bytes end = Bytes.wrap(timeKey(Long.MAX_VALUE, new byte[0]));
    try (KeyValueIterator<Bytes, byte[]> next = side.store.range(to, end)) {
      side.earliest = EMPTY;
      if (next.hasNext()) {
        side.earliest = ByteBuffer.wrap(next.next().key.get(), 1, 8).getLong();
      }
    }
  }

  private void countUnsettled(String storeId) {
    Long count = unsettled.get(storeId);
    unsettled.put(storeId, count == null ? 1L : count + 1);
  }

  private void emit(Buffered sale, Buffered payment) {
    String pair = "{\"sale\":" + sale.json + ",\"payment\":" + payment.json + "}";
    context.forward(
        new Record<>(
            sale.storeId.getBytes(StandardCharsets.UTF_8),
            pair.getBytes(StandardCharsets.UTF_8),
            Math.max(sale.ts, payment.ts)));
  }

  private static byte[] recordPrefix(byte[] joinKey) {
    return ByteBuffer.allocate(3 + joinKey.length)
        .put(RECORD)
        .putShort((short) joinKey.length)
        .put(joinKey)
        .array();
  }

  private static byte[] timeKey(long ts, byte[] seq) {
    return ByteBuffer.allocate(1 + 8 + seq.length).put(BY_TIME).putLong(ts).put(seq).array();
  }
}
