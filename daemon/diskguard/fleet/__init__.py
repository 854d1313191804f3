"""The fleet view: the aggregation math in plain Python, the Spark job that folds a fleet's
snapshots into daily summaries (inputs, daily, folding, store, job, session), the report's
figures computed from the summaries on the driver (window), the Kafka source and the HTML
report.

May import pyspark, the Kafka client, :mod:`diskguard.units` (the byte formatting shared
with the daemon's output) and :mod:`diskguard.properties` (Java ``.properties`` syntax, a
pure leaf: ``--kafka-config``); nothing from the daemon side (retention, flow, snapshots,
kafkalog, ...).
"""
