package rayk.jvm;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Kafka's Java producer as most users run it: idempotent (the default since Kafka 3.0),
 * acks=all, keyed records with a header. Sends `count` records "k<i>" / "v<i>" with header
 * "seq" = i and prints one "acked" event per record (partition, offset), then "done".
 *
 * Usage: ProduceCheck bootstrap topic count [extra producer property=value ...]
 */
public final class ProduceCheck {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        for (int i = 3; i < args.length; i++) {
            String[] setting = args[i].split("=", 2);
            props.put(setting[0], setting[1]);
        }
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                ProducerRecord<String, String> record = new ProducerRecord<>(topic, "k" + i, "v" + i);
                record.headers().add("seq", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
                sent.add(producer.send(record));
            }
            producer.flush();
            for (int i = 0; i < count; i++) {
                RecordMetadata acked = sent.get(i).get();
                Events.emit("acked", "seq", i, "partition", acked.partition(), "offset", acked.offset());
            }
        }
        Events.emit("done");
    }
}
