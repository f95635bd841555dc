"""The runtime: executes a validated Plan on torch.distributed, exactly as planned.

It knows no simulator and decides no schedule; device side effects sit behind
`runtime.devices`, a no-op on CPU, so every path runs on gloo CPU ranks in tests.
"""
