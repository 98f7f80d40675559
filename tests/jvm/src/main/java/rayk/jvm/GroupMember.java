package rayk.jvm;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.LinkedBlockingQueue;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * One member of a consumer group with the classic protocol and the cooperative-sticky
 * assignor (or, given group.protocol=consumer, KIP-848's protocol), as a Java application runs it: subscribe, poll, commitSync after each batch.
 * Prints "assigned" / "revoked" / "lost" events (with the generation), a "consumed" event
 * per batch (partition:offset:value), and reads commands on stdin:
 * "close" (close(): a dynamic member leaves, a static one stays in the group until its
 * session times out), "leave" (close with LEAVE_GROUP, which a static member needs to
 * leave at once) and "halt" (the process dies without a word).
 *
 * Usage: GroupMember bootstrap topic group instance-id|- [consumer property=value ...]
 * (classic: session.timeout.ms 6000 and heartbeat.interval.ms 500 unless given)
 */
public final class GroupMember {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, args[2]);
        if (!args[3].equals("-")) props.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, args[3]);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        for (int i = 4; i < args.length; i++) {
            String[] setting = args[i].split("=", 2);
            props.put(setting[0], setting[1]);
        }
        if (!"consumer".equals(props.get(ConsumerConfig.GROUP_PROTOCOL_CONFIG))) {
            // The classic protocol's settings; with group.protocol=consumer (KIP-848) the
            // broker assigns and sets the session and heartbeat times.
            props.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, CooperativeStickyAssignor.class.getName());
            props.putIfAbsent(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "6000");
            props.putIfAbsent(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
        }
        LinkedBlockingQueue<String> commands = new LinkedBlockingQueue<>();
        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                for (String line; (line = in.readLine()) != null; ) commands.add(line.trim());
            } catch (Exception e) {
                commands.add("halt");
            }
            commands.add("halt"); // the test went away: so does this member
        });
        stdin.setDaemon(true);
        stdin.start();

        KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props);
        consumer.subscribe(List.of(args[1]), new ConsumerRebalanceListener() {
            @Override public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                Events.emit("assigned", "partitions", Events.names(partitions),
                        "owned", Events.names(consumer.assignment()),
                        "generation", consumer.groupMetadata().generationId(),
                        "member_id", consumer.groupMetadata().memberId());
            }
            @Override public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                consumer.commitSync();
                Events.emit("revoked", "partitions", Events.names(partitions));
            }
            @Override public void onPartitionsLost(Collection<TopicPartition> partitions) {
                Events.emit("lost", "partitions", Events.names(partitions));
            }
        });
        while (true) {
            String command = commands.poll();
            if (command != null) {
                if (command.equals("halt")) Runtime.getRuntime().halt(1);
                consumer.close(command.equals("leave")
                        ? CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
                        : CloseOptions.timeout(Duration.ofSeconds(30)));
                Events.emit("closed", "how", command);
                return;
            }
            ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(100));
            if (records.isEmpty()) continue;
            List<String> consumed = new ArrayList<>();
            for (ConsumerRecord<String, String> record : records) {
                consumed.add(record.partition() + ":" + record.offset() + ":" + record.value());
            }
            consumer.commitSync();
            Events.emit("consumed", "records", consumed);
        }
    }
}
