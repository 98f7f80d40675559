package rayk.jvm;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.CommonClientConfigs;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialDeletion;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.config.SaslConfigs;
import org.apache.kafka.common.config.SslConfigs;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Kafka's Java clients on a SASL_SSL listener (SCRAM-SHA-512, the CA as a PEM truststore),
 * as a user named on the command line. The steps:
 *
 * grant USER PASSWORD TOPIC GROUP: the AdminClient adds SCRAM credentials for USER and ACLs
 * letting it write and read TOPIC as GROUP, then describes both.
 * use TOPIC GROUP: a producer writes 5 records to TOPIC and a consumer in GROUP reads them;
 * prints what each did, or the exception's class.
 * revoke USER: the AdminClient deletes USER's ACLs and credentials.
 *
 * Usage: SecureCheck bootstrap ca.pem user password step [args ...]
 */
public final class SecureCheck {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(CommonClientConfigs.SECURITY_PROTOCOL_CONFIG, "SASL_SSL");
        props.put(SslConfigs.SSL_TRUSTSTORE_TYPE_CONFIG, "PEM");
        props.put(SslConfigs.SSL_TRUSTSTORE_LOCATION_CONFIG, args[1]);
        props.put(SaslConfigs.SASL_MECHANISM, "SCRAM-SHA-512");
        props.put(SaslConfigs.SASL_JAAS_CONFIG, String.format(
                "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"%s\" password=\"%s\";",
                args[2], args[3]));
        props.put(CommonClientConfigs.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        switch (args[4]) {
            case "grant" -> grant(props, args[5], args[6], args[7], args[8]);
            case "use" -> use(props, args[5], args[6]);
            case "revoke" -> revoke(props, args[5]);
            default -> throw new IllegalArgumentException(args[4]);
        }
        Events.emit("done");
    }

    static void grant(Properties props, String user, String password, String topic, String group) throws Exception {
        try (Admin admin = Admin.create(props)) {
            ScramCredentialInfo info = new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192);
            admin.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(user, info, password))).all().get();
            UserScramCredentialsDescription described = admin.describeUserScramCredentials(List.of(user)).all().get().get(user);
            Events.emit("credentials", "user", described.name(), "mechanisms",
                    described.credentialInfos().stream().map(c -> c.mechanism() + ":" + c.iterations()).toList());

            String principal = "User:" + user;
            List<AclBinding> acls = new ArrayList<>();
            for (AclOperation operation : List.of(AclOperation.WRITE, AclOperation.READ, AclOperation.DESCRIBE)) {
                acls.add(new AclBinding(new ResourcePattern(ResourceType.TOPIC, topic, PatternType.LITERAL),
                        new AccessControlEntry(principal, "*", operation, AclPermissionType.ALLOW)));
            }
            acls.add(new AclBinding(new ResourcePattern(ResourceType.GROUP, group, PatternType.LITERAL),
                    new AccessControlEntry(principal, "*", AclOperation.READ, AclPermissionType.ALLOW)));
            admin.createAcls(acls).all().get();
            Events.emit("acls", "bindings", admin.describeAcls(ofPrincipal(principal)).values().get().stream()
                    .map(b -> b.pattern().resourceType() + ":" + b.pattern().name() + ":" + b.entry().operation())
                    .sorted().toList());
        }
    }

    static void use(Properties props, String topic, String group) throws Exception {
        Properties producerProps = (Properties) props.clone();
        producerProps.put(ProducerConfig.ACKS_CONFIG, "all");
        producerProps.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
        producerProps.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        producerProps.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps)) {
            for (int i = 0; i < 5; i++) producer.send(new ProducerRecord<>(topic, "secure-" + i)).get();
            Events.emit("produced", "records", 5);
        } catch (Exception e) {
            Throwable cause = e instanceof ExecutionException ? e.getCause() : e;
            Events.emit("produced", "error", cause.getClass().getSimpleName());
            return;
        }
        Properties consumerProps = (Properties) props.clone();
        consumerProps.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        consumerProps.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumerProps.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        consumerProps.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        List<String> values = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerProps)) {
            consumer.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 30_000;
            while (values.size() < 5 && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) values.add(record.value());
            }
            consumer.commitSync();
        }
        Events.emit("consumed", "values", values);
    }

    static void revoke(Properties props, String user) throws Exception {
        try (Admin admin = Admin.create(props)) {
            int deleted = admin.deleteAcls(List.of(ofPrincipal("User:" + user))).all().get().size();
            admin.alterUserScramCredentials(List.of(new UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)))
                    .all().get();
            Events.emit("revoked", "acls", deleted,
                    "users", admin.describeUserScramCredentials().all().get().keySet().stream().sorted().toList());
        }
    }

    static AclBindingFilter ofPrincipal(String principal) {
        return new AclBindingFilter(ResourcePatternFilter.ANY,
                new AccessControlEntryFilter(principal, null, AclOperation.ANY, AclPermissionType.ANY));
    }
}
