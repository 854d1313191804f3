"""The host: filesystem usage as df sees it, open files, crash-safe file writes, safe opens,
what an unlink frees and when (FIEMAP, syncfs), the inotify watches held, sd_notify,
whether a process id still runs. The lowest layer: imports nothing else from diskguard but
the plain ``kafkalog.model.FilesystemUsage`` record that ``fsusage`` fills."""
