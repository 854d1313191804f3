"""The fleet view: the aggregation math in plain Python, the Spark job that applies it to a
fleet's snapshots (inputs, transforms, job, session), the Kafka source and the HTML report.

May import pyspark, the Kafka client, :mod:`diskguard.units` (the byte formatting shared
with the daemon's output) and :mod:`diskguard.properties` (Java ``.properties`` syntax, a
pure leaf: ``--kafka-config``); nothing from the daemon side (retention, flow, snapshots,
kafkalog, ...).
"""
