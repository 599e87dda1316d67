"""The frame pipeline: decode → ingest → shard assembly → cross-rank → rules → transitions.

Pure of processes and sockets: :mod:`sentinel.daemon` carries it, :mod:`sentinel.serve`
exports what it wrote to the store.
"""
