import java.io.File;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * StoreLoad STOREDIR
 *
 * RocketMQ 4.9.4's own store, loaded as a broker loads it at start: a DefaultMessageStore on
 * STOREDIR (the store's default geometry: 1 GiB CommitLog segments, 6,000,000-byte ConsumeQueue
 * files, the default index), timed around load(), which maps every CommitLog segment and every
 * ConsumeQueue file, loads the index and recovers (normal recovery after a clean shutdown).
 * Nothing is started: no lock is taken, no service runs, nothing is written but what recovery
 * repairs. Prints "LOADED ok ms queues" and exits.
 */
public class StoreLoad {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: StoreLoad STOREDIR");
            System.exit(2);
        }
        String dir = new File(args[0]).getAbsolutePath();
        MessageStoreConfig config = new MessageStoreConfig();
        config.setStorePathRootDir(dir);
        config.setStorePathCommitLog(dir + File.separator + "commitlog");
        BrokerConfig broker = new BrokerConfig();
        DefaultMessageStore store = new DefaultMessageStore(
            config, new BrokerStatsManager(broker.getBrokerClusterName(), true), null, broker);
        long t0 = System.nanoTime();
        boolean ok = store.load();
        long t1 = System.nanoTime();
        int queues = store.getConsumeQueueTable().values().stream().mapToInt(m -> m.size()).sum();
        System.out.printf("LOADED %s %.1f %d%n", ok, (t1 - t0) / 1e6, queues);
        System.out.flush();
        // No shutdown(): it would flush and write the checkpoint and abort files; the process
        // exits with the store as load() left it.
        Runtime.getRuntime().halt(0);
    }
}
