"""The Ray runtime (runtime.kind=ray): the parts that runtime/build/ makes, placed as Ray actors."""
