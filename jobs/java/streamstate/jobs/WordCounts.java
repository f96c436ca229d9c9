package streamstate.jobs;

import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;

import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;

import scala.Tuple2;

/**
 * The word counts of each partition of text lines, counted as the lines are read.
 *
 * <p>A line gives no row per token: its tokens ({@link PythonText}) go into the partition's
 * own map, and the partition ends with one row per distinct word, {@code (key, count)}. The
 * caller sums them by word. Lines the stream dead-letters count nothing: a null value, more
 * than {@code maxBytes} bytes, not UTF-8.
 */
public final class WordCounts {
  private WordCounts() {}

  /** {@code lines}' column {@code value} (binary), counted per partition. */
  public static Dataset<Row> partial(Dataset<Row> lines, int maxBytes) {
    Dataset<byte[]> values = lines.select("value").as(Encoders.BINARY());
    MapPartitionsFunction<byte[], Tuple2<String, Long>> count = part -> counts(part, maxBytes);
    return values.mapPartitions(count, Encoders.tuple(Encoders.STRING(), Encoders.LONG()))
        .toDF("key", "count");
  }

  static Iterator<Tuple2<String, Long>> counts(Iterator<byte[]> lines, int maxBytes) {
    Map<String, long[]> counts = new HashMap<>();
    PythonText text = new PythonText();
    PythonText.Sink sink = word -> {
      long[] seen = counts.get(word);
      if (seen == null) {
        counts.put(word, new long[] {1});
      } else {
        seen[0]++;
      }
    };
    while (lines.hasNext()) {
      byte[] line = lines.next();
      if (line != null && line.length <= maxBytes) {
        text.tokens(line, sink);
      }
    }
    Iterator<Map.Entry<String, long[]>> entries = counts.entrySet().iterator();
    return new Iterator<>() {
      @Override
      public boolean hasNext() {
        return entries.hasNext();
      }

      @Override
      public Tuple2<String, Long> next() {
        Map.Entry<String, long[]> entry = entries.next();
        return new Tuple2<>(entry.getKey(), entry.getValue()[0]);
      }
    };
  }
}
