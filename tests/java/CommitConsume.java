import java.util.ArrayList;
import java.util.Comparator;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.consumer.store.RemoteBrokerOffsetStore;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * CommitConsume NAMESRV TOPIC GROUP broker/queueId=count[,broker/queueId=count...]
 *
 * A consumer group that reads part of a topic and commits how far it got, the way a Java service
 * does with the stock client: for each queue named, a DefaultMQPullConsumer of GROUP pulls from
 * the group's committed offset (the queue's min offset when it has none) until it has read
 * `count` messages or reached the queue's end, then commits the next offset to the broker
 * synchronously (UPDATE_CONSUMER_OFFSET). Queues not named are not touched: the group never
 * commits them. A heartbeat is sent first, so the broker knows the group (it then creates the
 * group's %RETRY% topic, which mqadmin consumerProgress looks the group's brokers up by).
 *
 * stdout: "MSG topic brokerName queueId queueOffset keys tags bodyHex" per message read (the
 * format of the kit's Consume), "COMMIT brokerName queueId offset" per queue, then "COUNT n".
 */
public class CommitConsume {
    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: CommitConsume NAMESRV TOPIC GROUP broker/queueId=count[,...]");
            System.exit(2);
        }
        String topic = args[1];
        Map<String, Integer> take = new LinkedHashMap<>();
        for (String item : args[3].split(",")) {
            String[] kv = item.split("=");
            take.put(kv[0], Integer.parseInt(kv[1]));
        }
        DefaultMQPullConsumer c = new DefaultMQPullConsumer(args[2]);
        c.setNamesrvAddr(args[0]);
        c.setInstanceName("commitconsume-" + ProcessHandle.current().pid());
        c.start();
        int rc = 0;
        long count = 0;
        try {
            Set<MessageQueue> all = null;
            long deadline = System.currentTimeMillis() + 30000;
            while (all == null || all.isEmpty()) {
                try {
                    all = c.fetchSubscribeMessageQueues(topic);
                } catch (Exception e) {
                    // The name server may not have the topic's route yet: ask again, until the deadline.
                    if (System.currentTimeMillis() > deadline) throw e;
                    Thread.sleep(200);
                }
            }
            // The same client instance the consumer runs on. A heartbeat goes to the brokers of
            // its route table, which fetchSubscribeMessageQueues does not fill: fill it first.
            MQClientInstance client = MQClientManager.getInstance().getOrCreateMQClientInstance(c);
            client.updateTopicRouteInfoFromNameServer(topic);
            client.sendHeartbeatToAllBrokerWithLock();
            List<MessageQueue> queues = new ArrayList<>(all);
            queues.sort(Comparator.comparing(MessageQueue::getBrokerName).thenComparingInt(MessageQueue::getQueueId));
            RemoteBrokerOffsetStore offsets = (RemoteBrokerOffsetStore) c.getOffsetStore();
            for (MessageQueue mq : queues) {
                Integer want = take.remove(mq.getBrokerName() + "/" + mq.getQueueId());
                if (want == null) continue;
                long next = c.fetchConsumeOffset(mq, true);
                if (next < 0) next = c.minOffset(mq);
                int got = 0;
                while (got < want) {
                    PullResult r = c.pull(mq, "*", next, Math.min(32, want - got), 5000L);
                    if (r.getPullStatus() != PullStatus.FOUND) break;  // the queue's end
                    for (MessageExt m : r.getMsgFoundList()) {
                        System.out.println("MSG\t" + m.getTopic() + "\t" + mq.getBrokerName() + "\t" + m.getQueueId()
                            + "\t" + m.getQueueOffset() + "\t" + m.getKeys() + "\t" + m.getTags() + "\t" + HexFormat.of().formatHex(m.getBody()));
                        got++;
                        count++;
                    }
                    next = r.getNextBeginOffset();
                }
                offsets.updateConsumeOffsetToBroker(mq, next, false);
                System.out.println("COMMIT\t" + mq.getBrokerName() + "\t" + mq.getQueueId() + "\t" + next);
            }
            if (!take.isEmpty()) throw new IllegalArgumentException("no such queue(s) of " + topic + ": " + take.keySet());
        } catch (Exception e) {
            System.err.println("ERROR " + e);
            e.printStackTrace();
            rc = 3;
        } finally {
            System.out.println("COUNT\t" + count);
            System.out.flush();
            c.shutdown();
        }
        System.exit(rc);
    }
}
