"""The offline executor: segment files deleted directly, only while no broker holds the log
dir's ``.lock``; crash-safe (journal first, ``*.deleted`` renames, recovery), guarded, audited,
and the sweep of what Kafka itself removes at start-up. Imports what ``retention`` may."""
