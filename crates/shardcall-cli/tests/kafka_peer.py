"""An independent Kafka client (kafka-python, not librdkafka) for the Kafka
end-to-end tests: it creates and grows topics, produces records, and reads
the offsets shardcall committed to its Kafka group.

    kafka_peer.py create BROKERS TOPIC PARTITIONS
    kafka_peer.py grow BROKERS TOPIC PARTITIONS
    kafka_peer.py produce BROKERS TOPIC PARTITIONS COUNT TAG
    kafka_peer.py committed BROKERS GROUP TOPIC

`produce` sends record i to partition i % PARTITIONS, one record per
batch, and prints a JSON object of how many went to each partition; `committed` prints the group's
committed offsets as a JSON object {partition: offset}.
"""

import json
import sys

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewPartitions, NewTopic


def admin(brokers):
    return KafkaAdminClient(bootstrap_servers=brokers, client_id="shardcall-peer")


def main(argv):
    cmd, brokers = argv[1], argv[2]
    if cmd == "create":
        topic, partitions = argv[3], int(argv[4])
        admin(brokers).create_topics(
            [NewTopic(name=topic, num_partitions=partitions, replication_factor=1)]
        )
    elif cmd == "grow":
        topic, partitions = argv[3], int(argv[4])
        admin(brokers).create_partitions({topic: NewPartitions(total_count=partitions)})
    elif cmd == "produce":
        topic, partitions, count, tag = argv[3], int(argv[4]), int(argv[5]), argv[6]
        producer = KafkaProducer(bootstrap_servers=brokers, acks="all", linger_ms=0)
        sent = {}
        for i in range(count):
            p = i % partitions
            key = ("k%d" % (i % 37)).encode()
            value = ("%s-%d" % (tag, i)).encode()
            # One record per batch, each acknowledged before the next: tansu
            # 0.6 cannot serve a fetch that starts inside a batch.
            producer.send(topic, key=key, value=value, partition=p).get(timeout=30)
            sent[p] = sent.get(p, 0) + 1
        producer.flush()
        producer.close()
        print(json.dumps(sent))
    elif cmd == "committed":
        group, topic = argv[3], argv[4]
        consumer = KafkaConsumer(
            bootstrap_servers=brokers, group_id=group, enable_auto_commit=False
        )
        parts = consumer.partitions_for_topic(topic) or set()
        out = {}
        for p in sorted(parts):
            offset = consumer.committed(TopicPartition(topic, p))
            if offset is not None:
                out[p] = offset
        consumer.close()
        print(json.dumps(out))
    else:
        raise SystemExit("unknown command %r" % cmd)


if __name__ == "__main__":
    main(sys.argv)
