package streamstate.kstreams;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;

/**
 * Runs one topology against a broker until its standard input closes.
 *
 * <pre>
 * java -cp ... streamstate.kstreams.Main --topology wordcount|inventory --bootstrap HOST:PORT
 *     --application-id ID --guarantee at_least_once|exactly_once_v2 --commit-ms N
 *     --state-dir DIR [--partitions 8] [--config name=value,...]
 * </pre>
 *
 * <p>One stream thread, default caching. The sink topics are created first (a broker with
 * auto-create off would otherwise leave every send waiting for metadata); Kafka Streams
 * creates its internal topics itself. Standard input takes commands: {@code dump PATH} writes
 * the tables ({@link Dump}) and answers {@code dumped PATH}; end of input stops the app.
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> options = options(args);
    String topology = options.get("topology");
    String bootstrap = options.get("bootstrap");
    String applicationId = options.get("application-id");
    Names names = new Names(applicationId);
    int partitions = Integer.parseInt(options.getOrDefault("partitions", "8"));
    createTopics(bootstrap, names.sinks(topology), partitions);
    Topology built =
        topology.equals(WordCount.NAME) ? WordCount.build(names) : Inventory.build(names);
    Properties config = new Properties();
    config.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
    config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    config.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, options.get("guarantee"));
    config.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, options.get("commit-ms"));
    config.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    config.put(StreamsConfig.STATE_DIR_CONFIG, options.get("state-dir"));
    config.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    for (String setting : options.getOrDefault("config", "").split(",")) {
      if (!setting.isBlank()) {
        String[] pair = setting.split("=", 2);
        config.put(pair[0].trim(), pair[1].trim());
      }
    }
    KafkaStreams streams = new KafkaStreams(built, config);
    streams.setStateListener((now, before) -> System.out.println("state " + now));
    streams.setUncaughtExceptionHandler(
        error -> {
          error.printStackTrace();
          return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(30))));
    streams.start();
    BufferedReader commands =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String command;
    while ((command = commands.readLine()) != null) {
      if (command.startsWith("dump ")) {
        Path path = Path.of(command.substring("dump ".length()).trim());
        Dump.write(streams, topology, path);
        System.out.println("dumped " + path);
      } else if (command.equals("stop")) {
        break;
      }
    }
    streams.close(Duration.ofSeconds(60));
  }

  static Map<String, String> options(String[] args) {
    Map<String, String> out = new HashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!args[i].startsWith("--")) {
        throw new IllegalArgumentException("expected --name value, got " + args[i]);
      }
      out.put(args[i].substring(2), args[i + 1]);
    }
    List<String> required =
        List.of("topology", "bootstrap", "application-id", "guarantee", "commit-ms", "state-dir");
    for (String name : required) {
      if (!out.containsKey(name)) {
        throw new IllegalArgumentException("missing --" + name);
      }
    }
    return out;
  }

  static void createTopics(String bootstrap, List<String> topics, int partitions)
      throws InterruptedException, ExecutionException {
    Properties config = new Properties();
    config.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    try (Admin admin = Admin.create(config)) {
      Set<String> existing = admin.listTopics().names().get();
      List<NewTopic> missing =
          topics.stream()
              .filter(topic -> !existing.contains(topic))
              .map(topic -> new NewTopic(topic, partitions, (short) 1))
              .collect(Collectors.toList());
      try {
        admin.createTopics(missing).all().get();
      } catch (ExecutionException error) {
        if (!(error.getCause() instanceof TopicExistsException)) {
          throw error;
        }
      }
    }
  }
}
