package streamstate.jobs;

import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.NoSuchElementException;

import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;

import scala.Tuple2;

/**
 * The word counts of each partition of text lines, counted as the lines are read.
 *
 * <p>A line gives no row per token: its tokens ({@link PythonText}) go into the partition's
 * own map, and the partition ends with one row per distinct word, {@code (key, count)} (or a
 * few, when the map filled up and started anew). The caller sums them by word. Lines the stream dead-letters count nothing: a null value, more
 * than {@code maxBytes} bytes, not UTF-8.
 */
public final class WordCounts {
  private WordCounts() {}

  /** Distinct words a partition's map holds before its counts are sent on and it starts anew. */
  static final int MAX_KEYS = 500_000;

  /** {@code lines}' column {@code value} (binary), counted per partition. */
  public static Dataset<Row> partial(Dataset<Row> lines, int maxBytes) {
    return partial(lines, maxBytes, MAX_KEYS);
  }

  /**
   * The same, sending the counts on whenever the map holds {@code maxKeys} words, so that a
   * partition of any size needs bounded memory (the caller's sum adds the parts up).
   */
  public static Dataset<Row> partial(Dataset<Row> lines, int maxBytes, int maxKeys) {
    Dataset<byte[]> values = lines.select("value").as(Encoders.BINARY());
    MapPartitionsFunction<byte[], Tuple2<String, Long>> count =
        part -> counts(part, maxBytes, maxKeys);
    return values.mapPartitions(count, Encoders.tuple(Encoders.STRING(), Encoders.LONG()))
        .toDF("key", "count");
  }

  static Iterator<Tuple2<String, Long>> counts(Iterator<byte[]> lines, int maxBytes, int maxKeys) {
    PythonText text = new PythonText();
    return new Iterator<>() {
      private Iterator<Map.Entry<String, long[]>> done = Collections.emptyIterator();

      @Override
      public boolean hasNext() {
        while (!done.hasNext() && lines.hasNext()) {
          done = countSome(lines, maxBytes, maxKeys, text).entrySet().iterator();
        }
        return done.hasNext();
      }

      @Override
      public Tuple2<String, Long> next() {
        if (!hasNext()) {
          throw new NoSuchElementException();
        }
        Map.Entry<String, long[]> entry = done.next();
        return new Tuple2<>(entry.getKey(), entry.getValue()[0]);
      }
    };
  }

  /** The counts of the next lines, until the map holds maxKeys words or the lines end. */
  private static Map<String, long[]> countSome(
      Iterator<byte[]> lines, int maxBytes, int maxKeys, PythonText text) {
    Map<String, long[]> counts = new HashMap<>();
    PythonText.Sink sink = word -> {
      long[] seen = counts.get(word);
      if (seen == null) {
        counts.put(word, new long[] {1});
      } else {
        seen[0]++;
      }
    };
    while (lines.hasNext() && counts.size() < maxKeys) {
      byte[] line = lines.next();
      if (line != null && line.length <= maxBytes) {
        text.tokens(line, sink);
      }
    }
    return counts;
  }
}
