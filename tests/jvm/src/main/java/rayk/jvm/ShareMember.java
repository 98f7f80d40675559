package rayk.jvm;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.LinkedBlockingQueue;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * One member of a share group (KIP-932) with Kafka's KafkaShareConsumer, in explicit
 * acknowledgement mode: it releases each record whose value starts with "release-" on its
 * first delivery, accepts every other, and commits after each poll. Prints a "consumed"
 * event per poll (partition:offset:value:deliveryCount) and a "committed" one with the
 * partitions whose acknowledgements failed; reads "close" or "halt" on stdin.
 *
 * Usage: ShareMember bootstrap topic group [consumer property=value ...]
 */
public final class ShareMember {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, args[2]);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put("share.acknowledgement.mode", "explicit");
        for (int i = 3; i < args.length; i++) {
            String[] setting = args[i].split("=", 2);
            props.put(setting[0], setting[1]);
        }
        LinkedBlockingQueue<String> commands = new LinkedBlockingQueue<>();
        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                for (String line; (line = in.readLine()) != null; ) commands.add(line.trim());
            } catch (Exception e) {
                commands.add("halt");
            }
            commands.add("halt");
        });
        stdin.setDaemon(true);
        stdin.start();

        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(props)) {
            consumer.subscribe(List.of(args[1]));
            Events.emit("subscribed");
            while (true) {
                String command = commands.poll();
                if (command != null) {
                    if (command.equals("halt")) Runtime.getRuntime().halt(1);
                    break;
                }
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) continue;
                List<String> consumed = new ArrayList<>();
                for (ConsumerRecord<String, String> record : records) {
                    short deliveries = record.deliveryCount().orElse((short) -1);
                    consumed.add(record.partition() + ":" + record.offset() + ":" + record.value() + ":" + deliveries);
                    boolean release = record.value().startsWith("release-") && deliveries == 1;
                    consumer.acknowledge(record, release ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT);
                }
                Events.emit("consumed", "records", consumed);
                List<String> failed = new ArrayList<>();
                consumer.commitSync().forEach((tp, error) -> error.ifPresent(e -> failed.add(tp + ": " + e)));
                Events.emit("committed", "failed", failed);
            }
        }
        Events.emit("closed");
    }
}
