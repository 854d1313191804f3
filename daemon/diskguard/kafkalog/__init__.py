"""Kafka's on-disk log format, read-only: the log-dir model, segment/index/record-batch
parsing, the ``.lock`` probe, KRaft metadata records, cleanup policies, the broker's
``.properties`` files. Pure modules (model, topicpolicy) plus file readers; imports only
``host`` (safe opens, fs identity) and ``properties`` (the ``.properties`` syntax,
shared with the fleet job's ``--kafka-config``)."""
