package rayk.jvm;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

/**
 * Kafka Streams' word count: lines from the input topic, split into words, regrouped by
 * word (a repartition topic Streams creates), counted in a state store (backed by a
 * compacted changelog topic Streams creates) and the counts written to the output topic.
 * Prints "state" events as the application moves (RUNNING, ...), an "error" event with
 * the exception's class if a stream thread dies, and stops on "close" from stdin.
 *
 * Usage: WordCount bootstrap application-id input output state-dir at_least_once|exactly_once_v2
 */
public final class WordCount {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args[5]);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "200");
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0"); // every update reaches the output
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, "3");
        props.put(StreamsConfig.consumerPrefix("session.timeout.ms"), "6000");
        props.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), "500");
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);

        StreamsBuilder builder = new StreamsBuilder();
        builder.<String, String>stream(args[2])
                .flatMapValues(line -> Arrays.asList(line.toLowerCase(Locale.ROOT).split("\\W+")))
                .filter((key, word) -> !word.isEmpty())
                .groupBy((key, word) -> word, Grouped.as("words"))
                .count(Materialized.as("counts"))
                .toStream()
                .to(args[3], Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            Events.emit("state", "state", now.toString());
            if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) stopped.countDown();
        });
        streams.setUncaughtExceptionHandler(error -> {
            Throwable cause = error;
            while (cause.getCause() != null) cause = cause.getCause();
            Events.emit("error", "error", error.getClass().getSimpleName(), "cause", cause.getClass().getSimpleName(),
                    "message", String.valueOf(cause.getMessage()));
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                while (in.readLine() != null) break;
            } catch (Exception ignored) {
                // the test went away: stop as for "close"
            }
            stopped.countDown();
        });
        stdin.setDaemon(true);
        stdin.start();
        streams.start();
        stopped.await();
        streams.close(Duration.ofSeconds(30));
        Events.emit("closed");
    }
}
