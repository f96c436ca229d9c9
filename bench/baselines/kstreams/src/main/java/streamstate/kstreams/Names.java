package streamstate.kstreams;

import java.util.List;

/**
 * The topics a topology reads and writes. It reads the project's source topics; what it
 * writes (dead letters, settled sales) goes to topics of its own, prefixed by its application
 * id, so that it never mixes with the project's output.
 */
public final class Names {
  public static final String TEXT_LINES = "text-lines";
  public static final String ITEM_EVENTS = "item-events";
  public static final String PAYMENTS = "payments";
  public static final String PRODUCTS = "products";

  public final String prefix;

  public Names(String applicationId) {
    this.prefix = applicationId + "-";
  }

  public String dlq(String source) {
    return prefix + source + "-dlq";
  }

  public String settledSales() {
    return prefix + "settled-sales";
  }

  /** The sink topics of a topology, which must exist before it starts. */
  public List<String> sinks(String topology) {
    if (topology.equals(WordCount.NAME)) {
      return List.of(dlq(TEXT_LINES));
    }
    return List.of(dlq(ITEM_EVENTS), dlq(PAYMENTS), settledSales());
  }
}
