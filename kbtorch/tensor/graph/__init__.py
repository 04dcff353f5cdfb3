"""Graph mode: a program's ops captured once and timed as one graph (``capture``), every call
of a function captured (``static_calls``), dynamo's graphs (``compile``), and the passes
that turn a graph's kernels into one simulation (``passes``)."""
