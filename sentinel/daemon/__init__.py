"""The process shells that carry the engine: the datagram listener, the service queue,
the daemon, the embedded child process and thread, and the NVML poller."""
