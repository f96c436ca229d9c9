package streamstate.kstreams;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static streamstate.kstreams.Driver.text;
import static streamstate.kstreams.Driver.utf8;

import java.util.List;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.test.TestRecord;
import org.junit.jupiter.api.Test;

class WordCountTest {
  static Driver driver(String guarantee) throws Exception {
    return new Driver(WordCount.build(new Names(Driver.APP)), guarantee);
  }

  @Test
  void wordsAreCountedAcrossLines() throws Exception {
    try (Driver d = driver(StreamsConfig.AT_LEAST_ONCE)) {
      TestInputTopic<byte[], byte[]> lines = d.input(Names.TEXT_LINES);
      lines.pipeInput(null, utf8("the cat, the HAT"));
      lines.pipeInput(null, utf8("The \u00c9t\u00e9 cat"));
      KeyValueStore<String, Long> counts = d.driver.getKeyValueStore(WordCount.STORE);
      assertEquals(3L, counts.get("the"));
      assertEquals(2L, counts.get("cat"));
      assertEquals(1L, counts.get("hat"));
      assertEquals(1L, counts.get("\u00e9t\u00e9"));
      assertEquals(null, counts.get("The"));
    }
  }

  @Test
  void aLineThatIsNotUtf8GoesToTheDeadLetterTopicWithItsHeaders() throws Exception {
    try (Driver d = driver(StreamsConfig.EXACTLY_ONCE_V2)) {
      TestInputTopic<byte[], byte[]> lines = d.input(Names.TEXT_LINES);
      byte[] bad = {'o', 'k', ' ', (byte) 0xc3};
      lines.pipeInput(utf8("k"), bad);
      TestOutputTopic<byte[], byte[]> dlq = d.output(d.names.dlq(Names.TEXT_LINES));
      List<TestRecord<byte[], byte[]>> dead = dlq.readRecordsToList();
      assertEquals(1, dead.size());
      assertEquals("k", text(dead.get(0).key()));
      assertArrayEquals(bad, dead.get(0).value());
      assertEquals("value: not UTF-8", text(dead.get(0).headers().lastHeader("error").value()));
      String topic = text(dead.get(0).headers().lastHeader("source-topic").value());
      assertEquals(Names.TEXT_LINES, topic);
      assertEquals("0", text(dead.get(0).headers().lastHeader("source-offset").value()));
      KeyValueStore<String, Long> counts = d.driver.getKeyValueStore(WordCount.STORE);
      assertEquals(null, counts.get("ok"));
    }
  }
}
