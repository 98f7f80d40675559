package rayk.jvm;

import java.util.Collection;
import java.util.Map;
import java.util.StringJoiner;
import java.util.TreeMap;
import org.apache.kafka.common.TopicPartition;

/** One JSON object per line on stdout: how the programs of this module tell pytest what happened. */
final class Events {
    private Events() {}

    /** Prints {"event": name, key: value, ...}; values are numbers, strings, lists or maps of them. */
    static synchronized void emit(String name, Object... keysAndValues) {
        Map<String, Object> fields = new TreeMap<>();
        for (int i = 0; i < keysAndValues.length; i += 2) fields.put((String) keysAndValues[i], keysAndValues[i + 1]);
        StringJoiner line = new StringJoiner(", ", "{", "}");
        line.add("\"event\": " + json(name));
        fields.forEach((key, value) -> line.add(json(key) + ": " + json(value)));
        System.out.println(line);
        System.out.flush();
    }

    /** "topic-partition" names, as Kafka's tools print them. */
    static String[] names(Collection<TopicPartition> partitions) {
        return partitions.stream().map(TopicPartition::toString).sorted().toArray(String[]::new);
    }

    static String json(Object value) {
        if (value == null) return "null";
        if (value instanceof Number || value instanceof Boolean) return value.toString();
        if (value instanceof Object[] items) {
            StringJoiner out = new StringJoiner(", ", "[", "]");
            for (Object item : items) out.add(json(item));
            return out.toString();
        }
        if (value instanceof Collection<?> items) return json(items.toArray());
        if (value instanceof Map<?, ?> map) {
            StringJoiner out = new StringJoiner(", ", "{", "}");
            map.forEach((k, v) -> out.add(json(String.valueOf(k)) + ": " + json(v)));
            return out.toString();
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : value.toString().toCharArray()) {
            if (c == '"' || c == '\\') out.append('\\').append(c);
            else if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
            else out.append(c);
        }
        return out.append('"').toString();
    }
}
