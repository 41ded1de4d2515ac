"""The GPUs as NVML sees them, through the real bindings (nvidia-ml-py): the dashboard's and the node agent's.

``sampler`` (``GpuSampler``: each GPU's reading, its MIG instances and processes), over
``nvml`` (the library's lifetime, each call's failure in words), ``nvml_counters``
(throughput counters as rates), ``gpm`` (GPU Performance Monitoring metrics) and
``processes`` with ``nvml_processes`` (which processes hold each GPU, named from /proc).
Nothing here runs in a training process.
"""
