"""The profiler: every block's forward, backward and memory at several micro-batch sizes."""
