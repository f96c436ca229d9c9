package streamstate.jobs;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;

import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * The inventory and sales totals of each partition of item events, summed as the events are
 * read: no row per event.
 *
 * <p>Each event in the plain form is parsed and judged by {@link ItemEventParser}. A valid
 * one adds its stock delta to its {@code (store_id, sku)} (a sale takes stock away) and keeps
 * the latest {@code ts}; a sale also adds its units and revenue to its category's tumbling
 * window, the category being that of the product's catalogue version at the sale's
 * {@code ts} ({@code jobs/transforms.py} catalogue_spans; "unknown" when there is none or it
 * is a deletion). Invalid events count nothing, as they go to the dead-letter topic in the
 * stream. Records outside the plain form are only counted, in {@code pending}, for the
 * caller's second pass.
 *
 * <p>The rows have the columns of {@code store_totals} in {@code jobs/transforms.py}, partial
 * per partition: the caller sums them by {@code (store_id, sku, category, window_start,
 * by_category)}.
 */
public final class StoreTotals {
  private StoreTotals() {}

  static final StructType SCHEMA = new StructType()
      .add("store_id", DataTypes.StringType)
      .add("sku", DataTypes.StringType)
      .add("category", DataTypes.StringType)
      .add("window_start", DataTypes.LongType)
      .add("on_hand", DataTypes.LongType)
      .add("updated_at", DataTypes.LongType)
      .add("units", DataTypes.LongType)
      .add("revenue", DataTypes.DoubleType)
      .add("pending", DataTypes.LongType)
      .add("by_category", DataTypes.IntegerType);

  /** The catalogue versions of each SKU, sorted by the time they begin to hold. */
  static final class Catalogue implements Serializable {
    private static final long serialVersionUID = 1L;
    private final Map<String, Spans> bySku = new HashMap<>();
    private final String unknown;

    /** One SKU's versions: when each begins and ends to hold, and its category. */
    private record Spans(long[] since, long[] until, String[] category) implements Serializable {}

    /** {@code spans}: rows of (sku, since, until, category), category null for a deletion. */
    Catalogue(List<Row> spans, String unknown) {
      this.unknown = unknown;
      Map<String, List<Row>> rowsBySku = new HashMap<>();
      for (Row span : spans) {
        rowsBySku.computeIfAbsent(span.getString(0), sku -> new ArrayList<>()).add(span);
      }
      Comparator<Row> order = Comparator.<Row>comparingLong(r -> r.getLong(1))
          .thenComparingLong(r -> r.getLong(2));
      for (Map.Entry<String, List<Row>> entry : rowsBySku.entrySet()) {
        List<Row> rows = entry.getValue();
        rows.sort(order);
        Spans versions = new Spans(
            new long[rows.size()], new long[rows.size()], new String[rows.size()]);
        for (int i = 0; i < rows.size(); i++) {
          versions.since()[i] = rows.get(i).getLong(1);
          versions.until()[i] = rows.get(i).getLong(2);
          versions.category()[i] = rows.get(i).getString(3);
        }
        bySku.put(entry.getKey(), versions);
      }
    }

    /** The category of {@code sku} at {@code ts}: of the version whose span holds it. */
    String at(String sku, long ts) {
      Spans versions = bySku.get(sku);
      if (versions == null) {
        return unknown;
      }
      long[] from = versions.since();
      int low = 0, high = from.length - 1, found = -1;
      while (low <= high) { // the last span that begins at or before ts
        int mid = (low + high) >>> 1;
        if (from[mid] <= ts) {
          found = mid;
          low = mid + 1;
        } else {
          high = mid - 1;
        }
      }
      if (found < 0 || ts >= versions.until()[found]) {
        return unknown;
      }
      String name = versions.category()[found];
      return name == null ? unknown : name;
    }
  }

  /** Keys (store and SKU, category and window) a partition's maps hold before their totals
   * are sent on and they start anew. */
  static final int MAX_KEYS = 500_000;

  /**
   * {@code events}' columns {@code key} and {@code value} (binary), summed per partition;
   * {@code spans} the catalogue's (sku, since, until, category), collected and broadcast.
   */
  public static Dataset<Row> partial(
      Dataset<Row> events, int maxBytes, Dataset<Row> spans, String unknown, long windowMs) {
    return partial(events, maxBytes, spans, unknown, windowMs, MAX_KEYS);
  }

  /**
   * The same, sending the totals on whenever the maps hold {@code maxKeys} keys, so that a
   * partition of any size needs bounded memory (the caller's sum adds the parts up).
   */
  public static Dataset<Row> partial(Dataset<Row> events, int maxBytes, Dataset<Row> spans,
      String unknown, long windowMs, int maxKeys) {
    Catalogue catalogue = new Catalogue(spans.collectAsList(), unknown);
    JavaSparkContext context =
        JavaSparkContext.fromSparkContext(events.sparkSession().sparkContext());
    Broadcast<Catalogue> shared = context.broadcast(catalogue);
    MapPartitionsFunction<Row, Row> sum = part -> new Summer(
        part, maxBytes, shared.value(), windowMs, maxKeys);
    return events.select("key", "value").mapPartitions(sum, Encoders.row(SCHEMA));
  }

  private record StoreSku(String storeId, String sku) {}

  private record Window(String category, long start) {}

  private static final class Sold {
    long units;
    double revenue;
  }

  /** The rows of one partition, summed a part at a time. */
  static final class Summer implements Iterator<Row> {
    private final Iterator<Row> events;
    private final int maxBytes, maxKeys;
    private final Catalogue catalogue;
    private final long windowMs;
    private final ItemEventParser p = new ItemEventParser();
    private Iterator<Row> done = Collections.emptyIterator();

    Summer(Iterator<Row> events, int maxBytes, Catalogue catalogue, long windowMs, int maxKeys) {
      this.events = events;
      this.maxBytes = maxBytes;
      this.catalogue = catalogue;
      this.windowMs = windowMs;
      this.maxKeys = maxKeys;
    }

    @Override
    public boolean hasNext() {
      while (!done.hasNext() && events.hasNext()) {
        done = sumSome();
      }
      return done.hasNext();
    }

    @Override
    public Row next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      return done.next();
    }

    /** The totals of the next events, until the maps hold maxKeys keys or the events end. */
    private Iterator<Row> sumSome() {
      Map<StoreSku, long[]> stock = new HashMap<>(); // on_hand, updated_at
      Map<Window, Sold> sales = new HashMap<>();
      long pending = 0;
      while (events.hasNext() && stock.size() + sales.size() < maxKeys) {
        Row event = events.next();
        byte[] key = event.isNullAt(0) ? null : (byte[]) event.get(0);
        byte[] value = event.isNullAt(1) ? null : (byte[]) event.get(1);
        int verdict = p.parse(key, value, maxBytes);
        if (verdict == ItemEventParser.NOT_PLAIN) {
          pending++;
          continue;
        }
        if (verdict != ItemEventParser.VALID) {
          continue;
        }
        boolean sale = p.kind.equals("sale");
        long[] item = stock.computeIfAbsent(
            new StoreSku(p.storeId, p.sku), k -> new long[] {0, Long.MIN_VALUE});
        item[0] += sale ? -p.quantity : p.quantity;
        item[1] = Math.max(item[1], p.ts);
        if (sale) {
          Window window = new Window(catalogue.at(p.sku, p.ts), p.ts - p.ts % windowMs);
          Sold sold = sales.computeIfAbsent(window, w -> new Sold());
          sold.units += p.quantity;
          sold.revenue += (double) p.quantity * p.unitPrice;
        }
      }
      return rows(stock, sales, pending).iterator();
    }
  }

  private static List<Row> rows(Map<StoreSku, long[]> stock, Map<Window, Sold> sales,
      long pending) {
    List<Row> rows = new ArrayList<>(stock.size() + sales.size() + 1);
    for (Map.Entry<StoreSku, long[]> entry : stock.entrySet()) {
      StoreSku item = entry.getKey();
      long[] total = entry.getValue();
      rows.add(RowFactory.create(
          item.storeId(), item.sku(), null, null, total[0], total[1], null, null, 0L, 0));
    }
    for (Map.Entry<Window, Sold> entry : sales.entrySet()) {
      Window window = entry.getKey();
      Sold total = entry.getValue();
      rows.add(RowFactory.create(
          null, null, window.category(), window.start(), null, null, total.units, total.revenue,
          0L, 1));
    }
    if (pending > 0) {
      rows.add(RowFactory.create(null, null, null, null, null, null, null, null, pending, 0));
    }
    return rows;
  }
}
