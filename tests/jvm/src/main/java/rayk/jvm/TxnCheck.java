package rayk.jvm;

import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Kafka's Java transactional producer and the transaction admin APIs, one step after
 * another, each printing an event:
 *
 * committed: a transaction of "c0".."c2" (partition 0) committed;
 * aborted: a transaction of "a0".."a2", sent and flushed, then aborted;
 * fenced: a second producer with the same transactional.id initialises while the first has
 * "z0" in an open transaction; the first's commit then fails (its exception's class);
 * committed_new: the second producer commits "n0".."n2";
 * described, producers, transactions: describeTransactions of the id (again until the
 * commit's markers are written), describeProducers of partition 0, listTransactions.
 *
 * Usage: TxnCheck bootstrap topic transactional-id
 */
public final class TxnCheck {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], txnId = args[2];
        try (KafkaProducer<String, String> first = producer(bootstrap, txnId)) {
            first.initTransactions();
            first.beginTransaction();
            for (int i = 0; i < 3; i++) first.send(new ProducerRecord<>(topic, 0, "k", "c" + i));
            first.commitTransaction();
            Events.emit("committed");

            first.beginTransaction();
            for (int i = 0; i < 3; i++) first.send(new ProducerRecord<>(topic, 0, "k", "a" + i));
            first.flush();
            first.abortTransaction();
            Events.emit("aborted");

            first.beginTransaction();
            first.send(new ProducerRecord<>(topic, 0, "k", "z0"));
            first.flush();
            try (KafkaProducer<String, String> second = producer(bootstrap, txnId)) {
                second.initTransactions();
                try {
                    first.commitTransaction();
                    Events.emit("fenced", "error", "none");
                } catch (KafkaException e) {
                    Events.emit("fenced", "error", e.getClass().getSimpleName());
                }
                second.beginTransaction();
                for (int i = 0; i < 3; i++) second.send(new ProducerRecord<>(topic, 0, "k", "n" + i));
                second.commitTransaction();
                Events.emit("committed_new");
            }
        }
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(props)) {
            // commitTransaction returns once the commit is decided; its markers follow.
            TransactionDescription described = admin.describeTransactions(List.of(txnId)).description(txnId).get();
            for (long deadline = System.currentTimeMillis() + 30_000;
                 described.state() != TransactionState.COMPLETE_COMMIT && System.currentTimeMillis() < deadline;
                 Thread.sleep(100)) {
                described = admin.describeTransactions(List.of(txnId)).description(txnId).get();
            }
            Events.emit("described", "state", described.state().toString(), "epoch", described.producerEpoch(),
                        "partitions", described.topicPartitions().size());
            TopicPartition partition = new TopicPartition(topic, 0);
            List<ProducerState> producers = admin.describeProducers(List.of(partition)).partitionResult(partition).get().activeProducers();
            Events.emit("producers", "count", producers.size(),
                        "open", producers.stream().filter(p -> p.currentTransactionStartOffset().isPresent()).count());
            for (TransactionListing listing : admin.listTransactions().all().get()) {
                if (listing.transactionalId().equals(txnId)) Events.emit("transactions", "state", listing.state().toString());
            }
        }
        Events.emit("done");
    }

    static KafkaProducer<String, String> producer(String bootstrap, String txnId) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return new KafkaProducer<>(props);
    }
}
