"""`attn serve` under load (`python -m bench serve`): throughput, latency, lost or wrong answers."""
