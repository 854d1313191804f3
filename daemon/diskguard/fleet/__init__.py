"""The fleet view: the aggregation math in plain Python, the Spark job that applies it to a
fleet's snapshots, the Kafka source and the HTML report. Imports nothing from the daemon."""
