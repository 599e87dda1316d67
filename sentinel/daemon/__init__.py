"""The process shells that carry the engine: the datagram listener, the service queue,
the daemon, a monitor's own engine (``launch.py``: the child process; ``embedded.py``: the
thread), the process checks and reply sockets the engine leaves to its carrier
(``processes.py``), evidence capture and the NVML poller."""
