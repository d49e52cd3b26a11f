"""The Ray runtime (runtime.kind=ray): the parts that runtime/assembly/ makes, placed as Ray actors."""
