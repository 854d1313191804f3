"""The running broker over the Kafka protocol (confluent-kafka's admin client): Metadata,
DeleteRecords, DescribeConfigs, committed offsets. An edge; imports only ``logs``."""
