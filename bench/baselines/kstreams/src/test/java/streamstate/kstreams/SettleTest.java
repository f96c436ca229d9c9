package streamstate.kstreams;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.utils.Bytes;
import org.junit.jupiter.api.Test;

class SettleTest {
  @Test
  void aBucketOfBufferedRecordsReadsBackAsWritten() {
    Map<Bytes, Settle.Buffered> bucket = new LinkedHashMap<>();
    bucket.put(Bytes.wrap(new byte[12]), new Settle.Buffered(5, 7, false, "s\u00f6", "{\"a\":1}"));
    byte[] seq = {0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 9};
    bucket.put(Bytes.wrap(seq), new Settle.Buffered(6, 8, true, "s2", "{}"));
    Map<Bytes, Settle.Buffered> read = Settle.bucket(Settle.encode(bucket));
    assertEquals(List.copyOf(bucket.keySet()), List.copyOf(read.keySet()));
    Settle.Buffered second = read.get(Bytes.wrap(seq));
    assertEquals(
        List.of(6L, 8L, "s2", "{}"),
        List.of(second.ts, second.watermark, second.storeId, second.json));
    assertTrue(second.matched);
    assertFalse(read.get(Bytes.wrap(new byte[12])).matched);
    assertEquals("s\u00f6", read.get(Bytes.wrap(new byte[12])).storeId);
    assertTrue(Settle.bucket(null).isEmpty());
  }

  @Test
  void aPaymentMatchesOnlyInsideTheWindowAndBeforeEitherSideClosedIt() {
    long minute = 60_000;
    Settle.Buffered sale = new Settle.Buffered(0, 0, false, "s", "{}");
    assertTrue(Settle.matches(sale, new Settle.Buffered(10 * minute, 0, false, "s", "{}")));
    assertFalse(Settle.matches(sale, new Settle.Buffered(11 * minute, 0, false, "s", "{}")));
    Settle.Buffered late = new Settle.Buffered(5 * minute, 11 * minute, false, "p", "{}");
    assertFalse(Settle.matches(sale, late));
    Settle.Buffered lateSale = new Settle.Buffered(0, 21 * minute, false, "s", "{}");
    assertFalse(Settle.matches(lateSale, new Settle.Buffered(0, 0, false, "s", "{}")));
    Settle.Buffered atTheEdge = new Settle.Buffered(10 * minute, 10 * minute, false, "s", "{}");
    assertFalse(Settle.matches(lateSale, atTheEdge));
    assertTrue(Settle.matches(new Settle.Buffered(0, 20 * minute, false, "s", "{}"), atTheEdge));
  }
}
