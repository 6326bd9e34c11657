"""What a study hands over: the `vllm serve` config, the report and its plots, MLflow runs."""
