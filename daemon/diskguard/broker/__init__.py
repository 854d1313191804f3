"""The running broker over the Kafka protocol (confluent-kafka's admin client): Metadata,
DeleteRecords, DescribeConfigs, committed offsets. An edge; imports only ``logs`` and the
planner's plain data (``Deletion``, ``DeletionResult``: what to delete, what came of it)."""
