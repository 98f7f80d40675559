package rayk.jvm;

import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.util.List;
import org.apache.kafka.common.message.MetadataRequestData;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.requests.AbstractResponse;
import org.apache.kafka.common.requests.MetadataRequest;
import org.apache.kafka.common.requests.MetadataResponse;
import org.apache.kafka.common.requests.RequestHeader;

/**
 * Requests a Java client could send but a negotiating one never does, framed and parsed
 * by kafka-clients' own classes on a plain socket to one broker:
 * "version": Metadata at one version above what the broker lists in ApiVersions, then at
 * the listed maximum on the same connection (prints the error of each answer);
 * "garbage": a frame that is no request on one connection, then Metadata on another
 * (prints whether the first was closed and what the second answered).
 *
 * Usage: RawRequests host port version|garbage max-metadata-version
 */
public final class RawRequests {
    public static void main(String[] args) throws Exception {
        String host = args[0];
        int port = Integer.parseInt(args[1]);
        short served = Short.parseShort(args[3]);
        if (args[2].equals("version")) {
            try (Socket socket = new Socket(host, port)) {
                Events.emit("answer", "version", served + 1, "error", metadata(socket, (short) (served + 1), 1));
                Events.emit("answer", "version", served, "error", metadata(socket, served, 2));
            }
        } else {
            try (Socket bad = new Socket(host, port); Socket good = new Socket(host, port)) {
                DataOutputStream out = new DataOutputStream(bad.getOutputStream());
                out.writeInt(7);
                out.write(new byte[] {0x7f, 0x7f, 0, 0, 0, 0, 1}); // api key 32639: no API, no header to answer
                out.flush();
                bad.setSoTimeout(10_000);
                boolean closed;
                try {
                    closed = bad.getInputStream().read() == -1;
                } catch (IOException reset) {
                    closed = true;
                }
                Events.emit("garbage", "closed", closed, "other_connection", metadata(good, served, 3));
            }
        }
    }

    /** Sends a Metadata request for no topic at `version`; the answer's error name. */
    static String metadata(Socket socket, short version, int correlationId) throws IOException {
        RequestHeader header = new RequestHeader(ApiKeys.METADATA, version, "raw-requests", correlationId);
        MetadataRequestData data = new MetadataRequestData().setTopics(List.of()).setAllowAutoTopicCreation(false);
        ByteBuffer request = new MetadataRequest(data, version).serializeWithHeader(header);
        DataOutputStream out = new DataOutputStream(socket.getOutputStream());
        out.writeInt(request.remaining());
        out.write(request.array(), request.arrayOffset() + request.position(), request.remaining());
        out.flush();
        DataInputStream in = new DataInputStream(socket.getInputStream());
        byte[] frame = new byte[in.readInt()];
        in.readFully(frame);
        MetadataResponse response = (MetadataResponse) AbstractResponse.parseResponse(ByteBuffer.wrap(frame), header);
        Errors error = Errors.forCode(response.data().errorCode());
        if (error == Errors.NONE && response.brokers().isEmpty()) return "NO_BROKERS";
        return error.name();
    }
}
