import java.io.File;
import java.lang.management.ManagementFactory;
import java.net.InetSocketAddress;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * StorePut STOREDIR WARMUP N QUEUES
 *
 * RocketMQ 4.9.4's own store taking one message per putMessage call, as its broker's send
 * processor hands them over: a DefaultMessageStore on STOREDIR with the broker's defaults
 * (ASYNC_FLUSH, 1 GiB CommitLog segments, the default ConsumeQueue and index geometry), started
 * (flush, reput-dispatch and clean services running). Each message is built in the loop as the
 * broker builds it from a request: topic BenchTopic, a 100-byte body (one of 26), queue i % QUEUES, tag
 * TagA/B/C, key order-i, a producer's UNIQ_KEY, this host as born and store host.
 *
 * WARMUP puts first (the JIT's warm-up, not timed), then N timed puts; the clock stops when the
 * dispatch (ConsumeQueue and index, on the store's reput thread) has caught up with the last
 * one, so the time includes it. Prints "PUT n seconds cpu_seconds record_bytes", where
 * cpu_seconds is the whole process's CPU over the timed span (every thread: put, dispatch,
 * flush, GC), then shuts the store down and exits.
 */
public class StorePut {
    private static final String[] TAGS = {"TagA", "TagB", "TagC"};
    // Message i's body is bytes 97 + (i + k) % 26 for k < 100 (bench/core.py's): 26 of them.
    private static final byte[][] BODIES = new byte[26][100];
    private static final long PID = ProcessHandle.current().pid();
    private static final int LOADER = StorePut.class.getClassLoader().hashCode();

    static {
        for (int i = 0; i < 26; i++) {
            for (int k = 0; k < 100; k++) {
                BODIES[i][k] = (byte) (97 + (i + k) % 26);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: StorePut STOREDIR WARMUP N QUEUES");
            System.exit(2);
        }
        String dir = new File(args[0]).getAbsolutePath();
        int warmup = Integer.parseInt(args[1]);
        int n = Integer.parseInt(args[2]);
        int queues = Integer.parseInt(args[3]);
        MessageStoreConfig config = new MessageStoreConfig();
        config.setStorePathRootDir(dir);
        config.setStorePathCommitLog(dir + File.separator + "commitlog");
        BrokerConfig broker = new BrokerConfig();
        DefaultMessageStore store = new DefaultMessageStore(
            config, new BrokerStatsManager(broker.getBrokerClusterName(), true), null, broker);
        if (!store.load()) {
            throw new IllegalStateException("load() failed on " + dir);
        }
        store.start();
        InetSocketAddress host = new InetSocketAddress("127.0.0.1", 10911);
        int bytes = put(store, 0, warmup, queues, host);
        caughtUp(store);
        com.sun.management.OperatingSystemMXBean os =
            (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        long cpu0 = os.getProcessCpuTime();
        long t0 = System.nanoTime();
        bytes = put(store, warmup, warmup + n, queues, host);
        caughtUp(store);
        long t1 = System.nanoTime();
        long cpu1 = os.getProcessCpuTime();
        System.out.printf("PUT %d %.6f %.6f %d%n", n, (t1 - t0) / 1e9, (cpu1 - cpu0) / 1e9, bytes);
        System.out.flush();
        store.shutdown();
        Runtime.getRuntime().halt(0);
    }

    /** Puts messages lo..hi-1; the size of the last record written. */
    private static int put(DefaultMessageStore store, int lo, int hi, int queues, InetSocketAddress host) {
        int bytes = 0;
        for (int i = lo; i < hi; i++) {
            long now = System.currentTimeMillis();
            MessageExtBrokerInner m = new MessageExtBrokerInner();
            m.setTopic("BenchTopic");
            m.setBody(BODIES[i % BODIES.length]);
            m.setQueueId(i % queues);
            String tag = TAGS[i % TAGS.length];
            m.setTags(tag);
            m.setKeys("order-" + i);
            // A producer's UNIQ_KEY as an IPv4 client makes it (32 hex digits: address, pid,
            // class loader, time, counter), whatever this host's first address is: the same
            // record size as rocketstore's put of the same message.
            MessageAccessor.putProperty(m, MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
                String.format("7F000001%04X%08X%08X%04X", PID & 0xFFFF, LOADER, now / 1000, i & 0xFFFF));
            m.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(tag));
            m.setPropertiesString(MessageDecoder.messageProperties2String(m.getProperties()));
            m.setBornTimestamp(now);
            m.setBornHost(host);
            m.setStoreHost(host);
            PutMessageResult r = store.putMessage(m);
            if (!r.isOk()) {
                throw new IllegalStateException("put " + i + ": " + r.getPutMessageStatus());
            }
            bytes = r.getAppendMessageResult().getWroteBytes();
        }
        return bytes;
    }

    /** Waits until the reput thread has dispatched everything the CommitLog holds. */
    private static void caughtUp(DefaultMessageStore store) throws InterruptedException {
        while (store.dispatchBehindBytes() > 0) {
            Thread.sleep(1);
        }
    }
}
