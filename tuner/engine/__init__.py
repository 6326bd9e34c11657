"""One engine per trial: the request it gets, the process that owns it, vLLM's counters, the hardware."""
