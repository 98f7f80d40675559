package rayk.jvm;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.TopicPartitionReplica;
import org.apache.kafka.common.config.ConfigResource;

/**
 * Kafka's Java AdminClient against a cluster, one step after another; each step prints an
 * event with what the broker answered, or an "error" event with the exception's class for
 * steps that must fail. The steps:
 *
 * topics: describeCluster, createTopics (with a config), describeTopics, describeConfigs,
 * incrementalAlterConfigs, createPartitions, listOffsets, deleteTopics.
 * groups GROUP TOPIC: listGroups, describeConsumerGroups, listConsumerGroupOffsets,
 * alterConsumerGroupOffsets, deleteConsumerGroups.
 * share-offsets GROUP TOPIC (an empty share group with a state for TOPIC-0):
 * listShareGroupOffsets, alterShareGroupOffsets (to 0, and a partition that does not exist),
 * deleteShareGroupOffsets.
 * unsupported TOPIC: APIs rayk leaves out of ApiVersions fail in the client, before any request.
 *
 * Usage: AdminCheck bootstrap step [args ...]
 */
public final class AdminCheck {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            switch (args[1]) {
                case "topics" -> topics(admin, args[2]);
                case "groups" -> groups(admin, args[2], args[3]);
                case "share-offsets" -> shareOffsets(admin, args[2], args[3]);
                case "unsupported" -> unsupported(admin, args[2]);
                default -> throw new IllegalArgumentException(args[1]);
            }
        }
        Events.emit("done");
    }

    static void topics(Admin admin, String topic) throws Exception {
        DescribeClusterResult cluster = admin.describeCluster();
        Events.emit("cluster", "cluster_id", cluster.clusterId().get(), "brokers", cluster.nodes().get().size(),
                "controller", cluster.controller().get().id());

        NewTopic created = new NewTopic(topic, 2, (short) 3).configs(Map.of("retention.ms", "3600000"));
        admin.createTopics(List.of(created)).all().get();
        Events.emit("created", "topic", topic);
        failure("create_existing", admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all());

        TopicDescription described = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
        List<Object> partitions = new ArrayList<>();
        for (TopicPartitionInfo p : described.partitions()) {
            partitions.add(Map.of("partition", p.partition(), "leader", p.leader().id(),
                    "replicas", p.replicas().size(), "isr", p.isr().size()));
        }
        Events.emit("described", "topic_id", described.topicId().toString(), "partitions", partitions);

        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        admin.incrementalAlterConfigs(Map.of(resource, List.of(
                new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("retention.ms", null), AlterConfigOp.OpType.DELETE)))).all().get();
        Events.emit("configs", "dynamic", dynamicConfigs(admin.describeConfigs(List.of(resource)).all().get().get(resource)));

        admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(4))).all().get();
        int count = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).partitions().size();
        Events.emit("partitions", "count", count);
        failure("shrink", admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(2))).all());

        Map<TopicPartition, OffsetSpec> latest = new TreeMap<>((a, b) -> a.partition() - b.partition());
        for (int p = 0; p < count; p++) latest.put(new TopicPartition(topic, p), OffsetSpec.latest());
        Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> offsets = admin.listOffsets(latest).all().get();
        Events.emit("offsets", "latest", offsets.values().stream().map(i -> i.offset()).toList());

        admin.deleteTopics(List.of(topic)).all().get();
        Events.emit("deleted", "topics", admin.listTopics().names().get().contains(topic) ? List.of(topic) : List.of());
        failure("delete_missing", admin.deleteTopics(List.of(topic)).all());
    }

    static void groups(Admin admin, String group, String topic) throws Exception {
        Collection<GroupListing> listed = admin.listGroups().all().get();
        Events.emit("listed", "groups", listed.stream().map(GroupListing::groupId).sorted().toList(),
                "types", listed.stream().filter(g -> g.groupId().equals(group))
                        .map(g -> g.type().map(Object::toString).orElse("?")).toList());

        ConsumerGroupDescription described = admin.describeConsumerGroups(List.of(group)).all().get().get(group);
        Events.emit("described", "state", described.groupState().toString(), "members", described.members().size(),
                "protocol", described.partitionAssignor(), "coordinator", described.coordinator().id());

        Map<TopicPartition, OffsetAndMetadata> committed =
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
        Events.emit("committed", "offsets", offsetsByPartition(committed));

        TopicPartition first = new TopicPartition(topic, 0);
        admin.alterConsumerGroupOffsets(group, Map.of(first, new OffsetAndMetadata(1, "moved by AdminCheck"))).all().get();
        Map<TopicPartition, OffsetAndMetadata> altered =
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
        Events.emit("altered", "offsets", offsetsByPartition(altered), "metadata", altered.get(first).metadata());

        admin.deleteConsumerGroups(List.of(group)).all().get();
        Events.emit("deleted", "groups", admin.listGroups().all().get().stream().map(GroupListing::groupId)
                .filter(group::equals).toList());
        failure("describe_deleted", admin.deleteConsumerGroups(List.of(group)).all());
    }

    /**
     * DescribeLogDirs, which rayk serves (a broker's one data directory), and an API it does not:
     * the client learns that from ApiVersions and fails the call itself.
     */
    static void unsupported(Admin admin, String topic) throws Exception {
        Map<String, LogDirDescription> dirs = admin.describeLogDirs(List.of(0)).allDescriptions().get().get(0);
        String path = dirs.keySet().iterator().next();
        LogDirDescription dir = dirs.get(path);
        Events.emit("described_log_dirs", "path", path, "dirs", dirs.size(),
                "error", dir.error() == null ? "" : dir.error().getClass().getSimpleName(),
                "replicas", dir.replicaInfos().size(), "total_bytes", dir.totalBytes().orElse(-1));
        failure("alter_replica_log_dirs", admin.alterReplicaLogDirs(Map.of(new TopicPartitionReplica(topic, 0, 0), "/tmp")).all());
        Events.emit("still_usable", "topics", admin.listTopics().names().get().size());
    }

    static Map<String, String> dynamicConfigs(Config config) {
        Map<String, String> out = new TreeMap<>();
        for (ConfigEntry entry : config.entries()) {
            if (entry.source() == ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG) out.put(entry.name(), entry.value());
        }
        return out;
    }

    static Map<String, Long> offsetsByPartition(Map<TopicPartition, OffsetAndMetadata> offsets) {
        Map<String, Long> out = new TreeMap<>();
        offsets.forEach((tp, offset) -> out.put(tp.toString(), offset.offset()));
        return out;
    }

    /** A step that must fail: prints the exception's class. */
    static void shareOffsets(Admin admin, String group, String topic) throws Exception {
        TopicPartition partition = new TopicPartition(topic, 0);
        Events.emit("share_listed", "offsets", shareOffsets(admin, group));
        admin.alterShareGroupOffsets(group, Map.of(partition, 0L)).all().get();
        Events.emit("share_altered", "offsets", shareOffsets(admin, group));
        failure("alter_missing_partition",
                admin.alterShareGroupOffsets(group, Map.of(new TopicPartition(topic, 7), 0L)).all());
        admin.deleteShareGroupOffsets(group, Set.of(topic)).all().get();
        Events.emit("share_deleted", "offsets", shareOffsets(admin, group));
    }

    static Map<String, Long> shareOffsets(Admin admin, String group) throws Exception {
        Map<String, Long> offsets = new TreeMap<>();
        admin.listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec())).partitionsToOffsetInfo(group)
                .get().forEach((tp, o) -> offsets.put(tp.toString(), o == null ? null : o.startOffset()));
        return offsets;
    }

    static void failure(String step, KafkaFuture<?> future) throws InterruptedException {
        try {
            future.get();
            Events.emit("error", "step", step, "error", "none");
        } catch (ExecutionException e) {
            Events.emit("error", "step", step, "error", e.getCause().getClass().getSimpleName(),
                    "message", String.valueOf(e.getCause().getMessage()));
        }
    }
}
