package streamstate.kstreams;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Properties;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyTestDriver;

/** A TopologyTestDriver over raw byte topics, with its own state directory. */
final class Driver implements AutoCloseable {
  static final String APP = "test-app";
  final Names names = new Names(APP);
  final TopologyTestDriver driver;
  private final Path stateDir;

  Driver(Topology topology, String guarantee) throws Exception {
    stateDir = Files.createTempDirectory("kstreams-test");
    Properties config = new Properties();
    config.put(StreamsConfig.APPLICATION_ID_CONFIG, APP);
    config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "unused:9092");
    config.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
    config.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
    driver = new TopologyTestDriver(topology, config);
  }

  TestInputTopic<byte[], byte[]> input(String topic) {
    return driver.createInputTopic(topic, new ByteArraySerializer(), new ByteArraySerializer());
  }

  TestOutputTopic<byte[], byte[]> output(String topic) {
    return driver.createOutputTopic(
        topic, new ByteArrayDeserializer(), new ByteArrayDeserializer());
  }

  static byte[] utf8(String text) {
    return text == null ? null : text.getBytes(StandardCharsets.UTF_8);
  }

  static String text(byte[] raw) {
    return new String(raw, StandardCharsets.UTF_8);
  }

  @Override
  public void close() throws Exception {
    driver.close();
    try (var paths = Files.walk(stateDir)) {
      paths.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    }
  }
}
