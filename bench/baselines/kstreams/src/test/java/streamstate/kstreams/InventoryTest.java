package streamstate.kstreams;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static streamstate.kstreams.Driver.text;
import static streamstate.kstreams.Driver.utf8;

import com.fasterxml.jackson.databind.JsonNode;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.ValueAndTimestamp;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.test.TestRecord;
import org.junit.jupiter.api.Test;

class InventoryTest {
  static final long HOUR = 3_600_000L;
  static final long MINUTE = 60_000L;
  /** An event time on an hour boundary. */
  static final long T = 1_700_002_800_000L;

  static String event(String id, String store, String sku, String kind, int quantity, long ts) {
    String price = kind.equals("sale") ? ",\"unit_price\":2.5" : "";
    return String.format(
        "{\"event_id\":\"%s\",\"store_id\":\"%s\",\"sku\":\"%s\",\"kind\":\"%s\","
            + "\"quantity\":%d%s,\"ts\":%d}",
        id, store, sku, kind, quantity, price, ts);
  }

  static String payment(String id, String sale, String store, long ts) {
    return String.format(
        "{\"payment_id\":\"%s\",\"sale_event_id\":\"%s\",\"store_id\":\"%s\","
            + "\"amount\":5.0,\"ts\":%d}",
        id, sale, store, ts);
  }

  static String product(String sku, String category) {
    return String.format(
        "{\"sku\":\"%s\",\"name\":\"n\",\"category\":\"%s\"}", sku, category);
  }

  static Driver driver() throws Exception {
    return new Driver(Inventory.build(new Names(Driver.APP)), StreamsConfig.AT_LEAST_ONCE);
  }

  static JsonNode stock(Driver d, String store) {
    KeyValueStore<byte[], ValueAndTimestamp<Stock>> stores =
        d.driver.getTimestampedKeyValueStore(Inventory.STOCK);
    ValueAndTimestamp<Stock> value = stores.get(utf8(store));
    return value == null ? null : Json.MAPPER.valueToTree(value.value());
  }

  @Test
  void saleSubtractsRestockAddsAndAdjustAddsItsSign() throws Exception {
    try (Driver d = driver()) {
      TestInputTopic<byte[], byte[]> items = d.input(Names.ITEM_EVENTS);
      items.pipeInput(utf8("s1"), utf8(event("e1", "s1", "a", "restock", 10, T + 5)));
      items.pipeInput(utf8("s1"), utf8(event("e2", "s1", "a", "sale", 3, T + 9)));
      items.pipeInput(utf8("s1"), utf8(event("e3", "s1", "b", "adjust", -2, T + 7)));
      JsonNode value = stock(d, "s1");
      assertEquals("s1", value.get("store_id").textValue());
      assertEquals(7, value.get("on_hand").get("a").longValue());
      assertEquals(-2, value.get("on_hand").get("b").longValue());
      assertEquals(T + 9, value.get("updated_at").longValue());
    }
  }

  @Test
  void invalidEventsGoToTheDeadLetterTopicAndChangeNothing() throws Exception {
    try (Driver d = driver()) {
      TestInputTopic<byte[], byte[]> items = d.input(Names.ITEM_EVENTS);
      List<String> bad =
          List.of(
              event("e1", "s2", "a", "restock", 1, T), // key is s1, store_id s2
              event("e2", "s1", "a", "sale", 0, T),
              event("e3", "s1", "a", "adjust", 0, T),
              event("e4", "s1", "a", "restock", 1, T).replace("\"quantity\":1", "\"quantity\":1.0"),
              event("e5", "s1", "a", "sale", 1, T).replace(",\"unit_price\":2.5", ""),
              event("e6", "s1", "a", "refund", 1, T),
              event("e7", "s1", "", "restock", 1, T),
              "{\"event_id\": \"e8\"",
              "[1, 2]");
      for (String value : bad) {
        items.pipeInput(utf8("s1"), utf8(value));
      }
      items.pipeInput(null, utf8(event("e9", "s1", "a", "restock", 1, T)));
      List<TestRecord<byte[], byte[]>> dead =
          d.output(d.names.dlq(Names.ITEM_EVENTS)).readRecordsToList();
      assertEquals(bad.size() + 1, dead.size());
      assertEquals(bad.get(0), text(dead.get(0).value()));
      assertTrue(text(dead.get(0).headers().lastHeader("error").value()).startsWith("key:"));
      assertEquals("1", text(dead.get(1).headers().lastHeader("source-offset").value()));
      assertNull(stock(d, "s1"));
    }
  }

  static Map<String, Long> units(Driver d) {
    WindowStore<String, ValueAndTimestamp<SalesTotal>> windows =
        d.driver.getTimestampedWindowStore(Inventory.SALES);
    Map<String, Long> out = new TreeMap<>();
    try (KeyValueIterator<Windowed<String>, ValueAndTimestamp<SalesTotal>> all = windows.all()) {
      while (all.hasNext()) {
        KeyValue<Windowed<String>, ValueAndTimestamp<SalesTotal>> kv = all.next();
        out.put(kv.key.key() + "@" + (kv.key.window().start() - T) / HOUR, kv.value.value().units);
      }
    }
    return out;
  }

  @Test
  void salesAreSummedPerCategoryAsOfTheirTimeInHourWindows() throws Exception {
    try (Driver d = driver()) {
      TestInputTopic<byte[], byte[]> products = d.input(Names.PRODUCTS);
      products.pipeInput(utf8("a"), utf8(product("a", "dairy")), Instant.ofEpochMilli(T - HOUR));
      products.pipeInput(utf8("a"), utf8(product("a", "frozen")), Instant.ofEpochMilli(T + HOUR));
      products.pipeInput(
          utf8("b"), utf8(product("b", "bakery")), Instant.ofEpochMilli(T + 3 * HOUR));
      TestInputTopic<byte[], byte[]> items = d.input(Names.ITEM_EVENTS);
      items.pipeInput(utf8("s1"), utf8(event("e1", "s1", "a", "sale", 2, T + 10)));
      items.pipeInput(utf8("s1"), utf8(event("e2", "s1", "a", "sale", 3, T + HOUR - 1)));
      items.pipeInput(utf8("s1"), utf8(event("e3", "s1", "a", "sale", 4, T + HOUR)));
      items.pipeInput(utf8("s1"), utf8(event("e4", "s1", "b", "sale", 1, T + HOUR)));
      items.pipeInput(utf8("s1"), utf8(event("e5", "s1", "a", "restock", 9, T + HOUR)));
      assertEquals(Map.of("dairy@0", 5L, "frozen@1", 4L, "unknown@1", 1L), units(d));
      WindowStore<String, ValueAndTimestamp<SalesTotal>> windows =
          d.driver.getTimestampedWindowStore(Inventory.SALES);
      assertEquals(12.5, windows.fetch("dairy", T).value().revenue, 1e-9);
    }
  }

  /** Sales at T in store s1: e1 paid in its window, e2 unpaid, e3 paid too late. */
  static List<KeyValue<String, String>> sales() {
    return List.of(
        KeyValue.pair(Names.ITEM_EVENTS, event("e1", "s1", "a", "sale", 1, T)),
        KeyValue.pair(Names.ITEM_EVENTS, event("e2", "s1", "a", "sale", 1, T)),
        KeyValue.pair(Names.ITEM_EVENTS, event("e3", "s1", "a", "sale", 1, T)),
        KeyValue.pair(Names.ITEM_EVENTS, event("e4", "s1", "a", "restock", 5, T + 30 * MINUTE)));
  }

  static List<KeyValue<String, String>> payments() {
    return List.of(
        KeyValue.pair(Names.PAYMENTS, payment("p1", "e1", "s1", T + 5 * MINUTE)),
        KeyValue.pair(Names.PAYMENTS, payment("p3", "e3", "s1", T + 11 * MINUTE)),
        KeyValue.pair(Names.PAYMENTS, payment("p9", "none", "s1", T + 30 * MINUTE)));
  }

  /** (unsettled count of s1, settled pairs as sale/payment ids) after the records in order. */
  static KeyValue<Long, TreeSet<String>> settle(List<KeyValue<String, String>> records)
      throws Exception {
    try (Driver d = driver()) {
      for (KeyValue<String, String> record : records) {
        d.input(record.key).pipeInput(utf8("s1"), utf8(record.value));
      }
      TreeSet<String> pairs = new TreeSet<>();
      for (TestRecord<byte[], byte[]> pair :
          d.output(d.names.settledSales()).readRecordsToList()) {
        JsonNode value = Json.MAPPER.readTree(pair.value());
        assertEquals("s1", text(pair.key()));
        pairs.add(
            value.get("sale").get("event_id").textValue()
                + "/"
                + value.get("payment").get("payment_id").textValue());
      }
      KeyValueStore<String, Long> unsettled = d.driver.getKeyValueStore(Settle.UNSETTLED);
      return KeyValue.pair(unsettled.get("s1"), pairs);
    }
  }

  @Test
  void aPaymentInTheWindowSettlesItsSaleAndTheOthersCountOnceTimeHasPassed() throws Exception {
    List<KeyValue<String, String>> records = new ArrayList<>(sales());
    records.addAll(payments());
    KeyValue<Long, TreeSet<String>> result = settle(records);
    assertEquals(2L, result.key);
    assertEquals(new TreeSet<>(List.of("e1/p1")), result.value);
  }

  @Test
  void theResultDoesNotDependOnHowTheTwoTopicsInterleave() throws Exception {
    List<KeyValue<String, String>> paymentsFirst = new ArrayList<>(payments());
    paymentsFirst.addAll(sales());
    List<KeyValue<String, String>> alternating = new ArrayList<>();
    for (int i = 0; i < 4; i++) {
      alternating.add(sales().get(i));
      if (i < 3) {
        alternating.add(payments().get(i));
      }
    }
    KeyValue<Long, TreeSet<String>> expected = KeyValue.pair(2L, new TreeSet<>(List.of("e1/p1")));
    assertEquals(expected, settle(paymentsFirst));
    assertEquals(expected, settle(alternating));
  }

  @Test
  void noSaleCountsAsUnsettledBeforeEventTimeOnBothSidesHasPassedItsWindow() throws Exception {
    KeyValue<Long, TreeSet<String>> result = settle(sales());
    assertNull(result.key);
  }

  @Test
  void anInvalidPaymentGoesToTheDeadLetterTopic() throws Exception {
    try (Driver d = driver()) {
      d.input(Names.PAYMENTS).pipeInput(utf8("s2"), utf8(payment("p1", "e1", "s1", T)));
      List<TestRecord<byte[], byte[]>> dead =
          d.output(d.names.dlq(Names.PAYMENTS)).readRecordsToList();
      assertEquals(1, dead.size());
      assertEquals(Names.PAYMENTS, text(dead.get(0).headers().lastHeader("source-topic").value()));
    }
  }
}
