"""kbtorch: a PyTorch front end to a discrete-event simulator of LLM kernels on AHBM."""
